-- The begin step of a snapshot (control slot; cluster.py).
-- KEYS[1] = worker record
-- ARGV[1] = ns, ARGV[2] = worker id, ARGV[3] = incarnation, ARGV[4], ARGV[5] = block cap,
-- ARGV[6] = blocks in the snapshot, ARGV[7] = token, ARGV[8] = snapshot seq
-- Returns {-1} unknown, {-2} stale, {-3 - cap} over the cap (nothing changed), else
-- {1, fresh handle, generation, ticket}: the old handle is retired, the record holds the
-- fresh one (n = 0 until the end step), seq = the snapshot's, pend = token (a pend left by
-- another operation is taken over: its end step will find it gone).

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
local now = now_ms()
redis.call('ZADD', BUSY, now, h .. ':' .. ARGV[7])
redis.call('HSET', rk, 'h', h, 'n', 0, 'seq', ARGV[8], 'pend', ARGV[7], 'pt', now)
return {1, h, redis.call('GET', GEN) or '', ticket()}
