-- A worker's heartbeat on a Redis Cluster (control slot).
-- KEYS[1] = worker record
-- ARGV: as heartbeat.lua
-- Returns as heartbeat.lua, but with last seq -1 (below anything reported: the service asks
-- for a snapshot) when a shard was lost since the worker's last snapshot or an operation
-- of it stopped midway.

--@include cluster_ctl

local f = redis.call('HMGET', KEYS[1], 'seq', 'rseq', 'inc', 'h', 'g', 'pt')
if not f[4] then return {0, 0, 0} end
if (f[3] or '0') ~= ARGV[3] then return {-1, 0, 0} end
redis.call('HSET', KEYS[1], 'hb', ARGV[1], 'rseq', ARGV[2], unpack(ARGV, 4))
local seq = tonumber(f[1] or '0')
if f[5] ~= redis.call('GET', GEN) or (f[6] and now_ms() - tonumber(f[6]) > PEND_STALE) then
  seq = -1
end
return {1, seq, tonumber(f[2] or '0')}
