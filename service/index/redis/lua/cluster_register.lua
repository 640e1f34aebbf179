-- Register (or re-register) a worker on a Redis Cluster (control slot).
-- KEYS[1] = registry, KEYS[2] = the new record (as register.lua)
-- ARGV: as register.lua
-- Returns -2 (nothing changed) while the control slot has no generation (lost: the service
-- recovers first), -1 as register.lua, else {had, handle, its ticket, generation}: the
-- service then resets the worker's lane with them (cluster_lane_reset, seq 0).

--@include cluster_ctl

local gen = redis.call('GET', GEN)
if not gen then return -2 end
--@include register_steps

return {had, h, ticket(), gen}
