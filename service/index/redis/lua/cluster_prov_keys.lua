-- Provisional entries of a worker on one Redis Cluster slot.
-- KEYS[1] = one of the provisional keys (it routes the call; every key of ARGV[6] has its
-- slot); the marker is set apart (ClusterBackend.add_provisional)
-- ARGV[1..6] as _prov_set: worker id, expiry ms, now ms, key TTL ms, PW, the keys
-- Returns 0.

--@include base
--@include prov_set
return 0
