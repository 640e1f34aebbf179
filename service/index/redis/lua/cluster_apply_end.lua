-- The end step of an event batch (control slot; cluster.py).
-- KEYS[1] = worker record
-- ARGV[1] = ns, ARGV[2] = worker id, ARGV[3] = token, ARGV[4] = incarnation, ARGV[5] = last
-- seq, ARGV[6] = entries added minus removed for the record's handle, ARGV[7], ARGV[8] =
-- block cap, ARGV[9..] = the busy marks to drop
-- Returns apply.lua's answers: {1, 0, last seq}, {-2, 0, 0} unknown, {-3, 0, seq} stale,
-- {-1, 0, seq} superseded (pend is not this batch's: a snapshot replaced it, or the record
-- is new), {-4, cap, 1} over the cap (a fresh handle, seq 0: resync).

--@include cluster_ctl

local rk = KEYS[1]
for i = 9, #ARGV do redis.call('ZREM', BUSY, ARGV[i]) end
local f = redis.call('HMGET', rk, 'pend', 'inc', 'h', 'n', 'total', 'tiers', 'seq')
if not f[3] then return {-2, 0, 0} end
local last = tonumber(f[7] or '0')
if (f[2] or '0') ~= ARGV[4] then return {-3, 0, last} end
if f[1] ~= ARGV[3] then return {-1, 0, last} end
redis.call('HDEL', rk, 'pend', 'pt')
local n, per_pool = tonumber(f[4] or '0') + tonumber(ARGV[6]), tonumber(ARGV[7])
if per_pool > 0 then
  local cap = cap_of(per_pool, tonumber(ARGV[8]), f[5], f[6])
  if n > cap then  -- the backstop: every entry of the handle is dropped
    local h = new_handle(ARGV[1], ARGV[2])
    retire(ARGV[1], f[3])
    redis.call('HSET', rk, 'seq', '0', 'h', h, 'n', 0)
    return {-4, cap, 1}
  end
end
redis.call('HSET', rk, 'seq', ARGV[5], 'n', n)
return {1, 0, tonumber(ARGV[5])}
