-- The end step of a snapshot (the worker's lane; lanes.py).
-- KEYS[1] = the worker's lane
-- ARGV[1] = token, ARGV[2] = incarnation, ARGV[3] = blocks indexed, ARGV[4] = the
-- generation the handle's draw saw
-- Returns the blocks indexed; -1 no lane, -2 stale, -4 superseded (another snapshot or a
-- registration replaced this one).

local lk = KEYS[1]
local f = redis.call('HMGET', lk, 'pend', 'inc', 'h')
if not f[3] then return -1 end
if (f[2] or '0') ~= ARGV[2] then return -2 end
if f[1] ~= ARGV[1] then return -4 end
redis.call('HDEL', lk, 'pend', 'pt')
redis.call('HSET', lk, 'n', ARGV[3], 'g', ARGV[4])
return tonumber(ARGV[3])
