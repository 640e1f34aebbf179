-- Register (or re-register) a worker.
-- KEYS[1] = registry, KEYS[2] = the new record 'kvm:{ctl}:w:<ns>|<id>'
-- ARGV[1] = worker id, ARGV[2] = ns, ARGV[3] = live-after ms ('': no takeover guard),
-- ARGV[4] = the new address, ARGV[5] = the new credential fingerprint,
-- ARGV[6..] = record field/value pairs
-- Returns -1 (nothing changed) when the id's record heartbeated after ARGV[3] from another
-- address or credential (a live worker holds the id); 1 when state of an earlier
-- registration of this worker id was dropped, else 0 (_register_steps).

--@include prelude
--@include register_steps
return had
