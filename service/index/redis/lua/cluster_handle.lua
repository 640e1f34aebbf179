-- Draw a worker a fresh handle and its ticket (control slot; lanes.py): a snapshot's begin
-- step, an AllBlocksCleared event, the block cap's backstop. The caller then resets the
-- worker's lane with them (cluster_lane_reset).
-- KEYS[1] = worker record
-- ARGV[1] = ns, ARGV[2] = worker id, ARGV[3] = incarnation, ARGV[4], ARGV[5] = block cap
-- (per pool, floor), ARGV[6] = blocks the new handle will hold (a snapshot's; checked
-- against the cap)
-- Returns {-1} unknown, {-2} stale, {-3 - cap} over the cap (nothing changed), else
-- {1, handle, ticket, generation, total blocks, tier blocks}: the record's old handle is
-- retired, the record names the new one.

--@include cluster_ctl

local rk = KEYS[1]
local f = redis.call('HMGET', rk, 'inc', 'h', 'total', 'tiers')
if not f[2] then return {-1} end
if (f[1] or '0') ~= ARGV[3] then return {-2} end
local per_pool = tonumber(ARGV[4])
if per_pool > 0 then
  local cap = cap_of(per_pool, tonumber(ARGV[5]), f[3], f[4])
  if tonumber(ARGV[6]) > cap then return {-3 - cap} end
end
local h = new_handle(ARGV[1], ARGV[2])
retire(ARGV[1], f[2])
redis.call('HSET', rk, 'h', h)
return {1, h, ticket(), redis.call('GET', GEN) or '', f[3] or '0', f[4] or '0'}
