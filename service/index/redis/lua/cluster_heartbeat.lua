-- A worker's heartbeat on a Redis Cluster (control slot), sent beside cluster_lane_beat.
-- KEYS[1] = worker record
-- ARGV: as heartbeat.lua
-- Returns {0} for an unknown worker (the record is NOT created), {-1} for a stale
-- incarnation (nothing stored), else {1, reported seq of the previous heartbeat, the
-- record's handle, the shards' generation}: the service answers last seq -1 (a snapshot)
-- unless the lane names that handle and generation and no step of it stopped midway.

--@include cluster_ctl

local f = redis.call('HMGET', KEYS[1], 'rseq', 'inc', 'h')
if not f[3] then return {0} end
if (f[2] or '0') ~= ARGV[3] then return {-1} end
redis.call('HSET', KEYS[1], 'hb', ARGV[1], 'rseq', ARGV[2], unpack(ARGV, 4))
return {1, tonumber(f[1] or '0'), f[3], redis.call('GET', GEN) or ''}
