-- Fragment: set or renew a worker's provisional entries, after _base.
-- KEYS: none read (those of the script that includes it).
-- ARGV[1] = worker id, ARGV[2] = its expiry ms, ARGV[3] = now ms, ARGV[4] = key TTL ms,
-- ARGV[5] = PW, the bytes of one provisional key, ARGV[6] = the provisional keys
-- 'p{T}<hash><ns>' of the blocks the worker provisionally holds (keys.prov_key,
-- concatenated)
-- Each key's STRING = ';worker|expiry_ms;...': the worker's entry is set/renewed, other
-- unexpired holders kept, expired ones dropped; the key gets the TTL.


local wid, now, pw, ks = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[5]), ARGV[6]
for a = 1, #ks, pw do
  local pk = string.sub(ks, a, a + pw - 1)
  local v = ';' .. wid .. '|' .. ARGV[2]
  local old = redis.call('GET', pk)
  if old then
    for other, exp in string.gmatch(old, ';([^|;]+)|(%d+)') do
      if other ~= wid and tonumber(exp) > now then v = v .. ';' .. other .. '|' .. exp end
    end
  end
  redis.call('SET', pk, v, 'PX', ARGV[4])
end
