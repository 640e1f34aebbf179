-- The begin step of an event batch (control slot; cluster.py).
-- KEYS[1] = worker record
-- ARGV[1] = ns, ARGV[2] = worker id, ARGV[3] = first seq, ARGV[4] = last seq, ARGV[5] =
-- incarnation, ARGV[6], ARGV[7] = block cap (per pool, floor), ARGV[8] = stored minus
-- removed hashes of the whole batch (the cap check, as apply.lua), ARGV[9] = token,
-- ARGV[10] = the seqs of the batch's Cleared events, space separated
-- Returns apply.lua's answers for unknown (-2), stale (-3), duplicate (0), gap (-1, also
-- while pend is set or the generation moved) and over the cap (-4, nothing changed); else
-- {1, last seq, ticket, handles...}: the batch's ticket (its wave carries it:
-- handle_fence.py), the record's handle, then one fresh handle per fresh Cleared (each
-- retires the one before; the record names the last, with n = 0 when it is fresh).

--@include cluster_ctl

local rk = KEYS[1]
local f = redis.call('HMGET', rk, 'seq', 'inc', 'h', 'n', 'total', 'tiers', 'pend', 'g')
if not f[3] then return {-2, 0, 0} end
local last = tonumber(f[1] or '0')
if (f[2] or '0') ~= ARGV[5] then return {-3, 0, last} end
if tonumber(ARGV[4]) <= last then return {0, 0, last} end
if tonumber(ARGV[3]) > last + 1 then return {-1, 0, last} end
if f[7] or f[8] ~= redis.call('GET', GEN) then return {-1, 0, last} end
local per_pool = tonumber(ARGV[6])
if per_pool > 0 then
  local cap = cap_of(per_pool, tonumber(ARGV[7]), f[5], f[6])
  if tonumber(f[4] or '0') + tonumber(ARGV[8]) > cap then return {-4, cap, 0} end
end
local hs = {f[3]}
for s in string.gmatch(ARGV[10], '%d+') do
  if tonumber(s) > last then
    hs[#hs + 1] = new_handle(ARGV[1], ARGV[2])
    retire(ARGV[1], hs[#hs - 1])
  end
end
local now = now_ms()
for _, h in ipairs(hs) do redis.call('ZADD', BUSY, now, h .. ':' .. ARGV[9]) end
if #hs > 1 then redis.call('HSET', rk, 'h', hs[#hs], 'n', 0) end
redis.call('HSET', rk, 'pend', ARGV[9], 'pt', now)
return {1, last, ticket(), unpack(hs)}
