-- The begin step of an event batch (the worker's own slot: its lane; lanes.py). A batch
-- holds no AllBlocksCleared event (the service cuts the batch there: each draws a handle).
-- KEYS[1] = the worker's lane
-- ARGV[1] = first seq, ARGV[2] = last seq, ARGV[3] = incarnation, ARGV[4], ARGV[5] = block
-- cap (per pool, floor), ARGV[6] = stored minus removed hashes of the batch (the cap check,
-- as apply.lua), ARGV[7] = token, ARGV[8] = the shards' generation the service last read
-- Returns apply.lua's answers for no lane (-2), stale (-3), duplicate (0), gap (-1, also
-- while pend is set) and over the cap (-4, nothing changed); -5 when the lane's generation
-- is not ARGV[8] (the service reads the generation again, or the worker resyncs); else
-- {1, last seq, ticket, handle}: the lane's handle and the ticket drawn with it (the
-- batch's wave carries it: handle_fence.py), pend = token.

--@include lane

local lk = KEYS[1]
local f = redis.call('HMGET', lk, 'seq', 'inc', 'h', 'n', 'total', 'tiers', 'pend', 'g', 'tk')
if not f[3] then return {-2, 0, 0} end
local last = tonumber(f[1] or '0')
if (f[2] or '0') ~= ARGV[3] then return {-3, 0, last} end
if tonumber(ARGV[2]) <= last then return {0, 0, last} end
if tonumber(ARGV[1]) > last + 1 or f[7] then return {-1, 0, last} end
if f[8] ~= ARGV[8] then return {-5, 0, last} end
local per_pool = tonumber(ARGV[4])
if per_pool > 0 then
  local cap = cap_of(per_pool, tonumber(ARGV[5]), f[5], f[6])
  if tonumber(f[4] or '0') + tonumber(ARGV[6]) > cap then return {-4, cap, 0} end
end
redis.call('HSET', lk, 'pend', ARGV[7], 'pt', now_ms())
return {1, last, f[9], f[3]}
