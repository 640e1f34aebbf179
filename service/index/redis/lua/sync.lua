-- A worker's snapshot: it replaces every entry of the worker.
-- KEYS[1] = worker record
-- ARGV[1] = ns, ARGV[2] = worker id, ARGV[3] = snapshot seq, ARGV[4] = KW (bytes of a
-- block key), ARGV[5] = the blocks' keys (concatenated, distinct; orphans already dropped
-- by the caller), ARGV[6] = their tier masks, one digit each, ARGV[7] = the worker's
-- incarnation, ARGV[8], ARGV[9] = the block cap (as apply.lua)
-- The worker gets a fresh handle holding exactly the snapshot; the old one is retired.
-- Returns the number of blocks indexed, -1 for an unknown worker, -2 for a stale
-- incarnation, -3 - cap for a snapshot over the cap (nothing changed in these three cases).

--@include prelude

local rk = KEYS[1]
local f = redis.call('HMGET', rk, 'inc', 'h', 'total', 'tiers')
if not f[2] then return -1 end
if (f[1] or '0') ~= ARGV[7] then return -2 end
local ns, wid, w, masks = ARGV[1], ARGV[2], tonumber(ARGV[4]), ARGV[6]
if tonumber(ARGV[8]) > 0 then
  local cap = math.max(tonumber(ARGV[8]) * (tonumber(f[3] or '0') + tonumber(f[4] or '0')),
                       tonumber(ARGV[9]))
  if #masks > cap then return -3 - cap end
end
local h = new_handle(ns, wid)
retire(ns, f[2])
local hb = hbytes(tonumber(h))
local ks = keys_of(ARGV[5], w)
fetch(ks)
for j, k in ipairs(ks) do
  local m = tonumber(string.sub(masks, j, j))
  put(k, (hold(cur[k], hb, m, hb .. string.char(m))))
end
flush()
redis.call('HSET', rk, 'seq', ARGV[3], 'h', h, 'n', #masks)
return #masks
