-- Fragment: the body of a registration (register.lua, cluster_register.lua), after _prelude.
-- KEYS[1] = registry, KEYS[2] = the new record 'kvm:{ctl}:w:<ns>|<id>'
-- ARGV[1] = worker id, ARGV[2] = ns, ARGV[3] = live-after ms ('': no takeover guard),
-- ARGV[4] = the new address, ARGV[5] = the new credential fingerprint,
-- ARGV[6..] = record field/value pairs
-- Returns -1 (nothing changed) when the id's record heartbeated after ARGV[3] from another
-- address or credential (a live worker holds the id); else leaves `had` = 1 when state of
-- an earlier registration of this worker id was dropped, else 0. The new record gets a
-- fresh handle (field 'h') and 'n' = 0 entries; an earlier registration's handle is
-- retired.


local wid, ns = ARGV[1], ARGV[2]
local old = redis.call('HGET', KEYS[1], wid)
local f = {}
if old then
  f = redis.call('HMGET', record_key(old, wid), 'hb', 'address', 'cred', 'h')
  if ARGV[3] ~= '' and f[1] and tonumber(f[1]) > tonumber(ARGV[3])
      and (f[2] ~= ARGV[4] or (f[3] or '') ~= ARGV[5]) then
    return -1
  end
end
local stray = redis.call('HGET', KEYS[2], 'h')  -- a record the registry lost
local h = new_handle(ns, wid)
local had = 0
if old then
  retire(old, f[4])
  redis.call('DEL', record_key(old, wid))
  had = 1
end
if stray then
  retire(ns, stray)
  had = 1
end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], wid, ns)
for i = 6, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
redis.call('HSET', KEYS[2], 'h', h, 'n', 0)
