-- Purge a worker: its record goes, its handle is retired.
-- KEYS[1] = registry, KEYS[2] = worker record
-- ARGV[1] = ns, ARGV[2] = worker id, ARGV[3] = heartbeat deadline ms ('' = purge
-- regardless of heartbeats)
-- Returns 1 when purged (record gone, handle retired), 0 when unknown or it heartbeated
-- at/after the deadline.

--@include prelude

local f = redis.call('HMGET', KEYS[2], 'h', 'hb')
if not f[1] then return 0 end
if ARGV[3] ~= '' and tonumber(f[2] or '0') >= tonumber(ARGV[3]) then return 0 end
retire(ARGV[1], f[1])
redis.call('DEL', KEYS[2])
if redis.call('HGET', KEYS[1], ARGV[2]) == ARGV[1] then redis.call('HDEL', KEYS[1], ARGV[2]) end
return 1
