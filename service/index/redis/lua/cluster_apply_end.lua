-- The end step of an event batch (the worker's lane; lanes.py).
-- KEYS[1] = the worker's lane
-- ARGV[1] = token, ARGV[2] = incarnation, ARGV[3] = last seq, ARGV[4] = entries added
-- minus removed for the lane's handle, ARGV[5], ARGV[6] = block cap
-- Returns apply.lua's answers: {1, 0, last seq}, {-2, 0, 0} no lane, {-3, 0, seq} stale,
-- {-1, 0, seq} superseded (pend is not this batch's: a reset replaced it), {-4, cap, 1}
-- over the cap: the backstop, seq 0 (every later batch a gap until a snapshot); the
-- caller then draws a fresh handle (cluster_handle), which drops every entry of this one.

--@include lane

local lk = KEYS[1]
local f = redis.call('HMGET', lk, 'pend', 'inc', 'h', 'n', 'total', 'tiers', 'seq')
if not f[3] then return {-2, 0, 0} end
local last = tonumber(f[7] or '0')
if (f[2] or '0') ~= ARGV[2] then return {-3, 0, last} end
if f[1] ~= ARGV[1] then return {-1, 0, last} end
redis.call('HDEL', lk, 'pend', 'pt')
local n, per_pool = tonumber(f[4] or '0') + tonumber(ARGV[4]), tonumber(ARGV[5])
if per_pool > 0 then
  local cap = cap_of(per_pool, tonumber(ARGV[6]), f[5], f[6])
  if n > cap then
    redis.call('HSET', lk, 'seq', '0', 'n', n)
    return {-4, cap, 1}
  end
end
redis.call('HSET', lk, 'seq', ARGV[3], 'n', n)
return {1, 0, tonumber(ARGV[3])}
