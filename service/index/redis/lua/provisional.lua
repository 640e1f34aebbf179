-- Provisional entries of a worker (a single server: every key in one script).
-- KEYS[1] = the namespace's provisional marker 'kvm:{ctl}:pm:<ns>' (lookups read
--           provisional keys only while it exists)
-- ARGV[1..6] as _prov_set: worker id, expiry ms, now ms, key TTL ms, PW, the keys
-- Every key gets the TTL, and so does the marker. Returns 0.

--@include base
--@include prov_set
redis.call('SET', KEYS[1], '1', 'PX', ARGV[4])
return 0
