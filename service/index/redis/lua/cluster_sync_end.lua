-- The end step of a snapshot (control slot; cluster.py).
-- KEYS[1] = worker record
-- ARGV[1] = token, ARGV[2] = incarnation, ARGV[3] = blocks indexed, ARGV[4] = the
-- generation cluster_sync_begin saw, ARGV[5] = the busy mark to drop
-- Returns the blocks indexed; -1 unknown, -2 stale, -4 superseded (another snapshot or a
-- registration replaced this one).

--@include cluster_ctl

local rk = KEYS[1]
redis.call('ZREM', BUSY, ARGV[5])
local f = redis.call('HMGET', rk, 'pend', 'inc', 'h')
if not f[3] then return -1 end
if (f[2] or '0') ~= ARGV[2] then return -2 end
if f[1] ~= ARGV[1] then return -4 end
redis.call('HDEL', rk, 'pend', 'pt')
redis.call('HSET', rk, 'n', ARGV[3], 'g', ARGV[4])
return tonumber(ARGV[3])
