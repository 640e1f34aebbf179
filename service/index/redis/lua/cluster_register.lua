-- Register (or re-register) a worker on a Redis Cluster (control slot).
-- KEYS[1] = registry, KEYS[2] = the new record (as register.lua)
-- ARGV: as register.lua
-- Returns -2 (nothing changed) while the control slot has no generation (lost: the service
-- recovers first), else as register.lua; the record gets 'g', the current generation.

--@include cluster_ctl

local gen = redis.call('GET', GEN)
if not gen then return -2 end
--@include register_steps

redis.call('HSET', KEYS[2], 'g', gen)
return had
