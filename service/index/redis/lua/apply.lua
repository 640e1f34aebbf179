-- A worker's batch of events, in seq order.
-- KEYS[1] = worker record
-- ARGV[1] = ns, ARGV[2] = worker id, ARGV[3] = seq of the first event, ARGV[4] = seq of the
-- last event, ARGV[5] = KW, the bytes of one block key, ARGV[6] = the worker's incarnation,
-- ARGV[7], ARGV[8] = the block cap: per pool block, floor (BlockCap; per pool 0 = no cap),
-- ARGV[9..] = the events, flattened (KEYS = the blocks' keys, concatenated):
--   'S' tierbits parent_key_or_empty KEYS   (BlockStored, chain order)
--   'R' tierbits KEYS                       (BlockRemoved)
--   'C'                                     (AllBlocksCleared: a fresh handle)
-- Events with seq <= the record's seq were applied before (a retried batch): skipped.
-- The block cap is max(per_pool * (the record's 'total' + 'tiers'), floor): a batch for
-- which n (entries held) + stored - removed hashes exceeds it is refused before any work
-- ({-4, cap, 0}); one that still ends over it (a backstop) drops all the worker's entries
-- (a fresh handle) and resets its seq to 0 ({-4, cap, 1}: it must resync).
-- Returns {status, applied, last seq}: status 1 applied, 0 duplicate, -1 gap, -2 unknown,
-- -3 stale incarnation (nothing applied), -4 over the cap.

--@include prelude

local rk = KEYS[1]
local f = redis.call('HMGET', rk, 'seq', 'inc', 'h', 'n', 'total', 'tiers')
if not f[3] then return {-2, 0, 0} end
local last = tonumber(f[1] or '0')
if (f[2] or '0') ~= ARGV[6] then return {-3, 0, last} end
if tonumber(ARGV[4]) <= last then return {0, 0, last} end
if tonumber(ARGV[3]) > last + 1 then return {-1, 0, last} end
local ns, wid, w = ARGV[1], ARGV[2], tonumber(ARGV[5])
local h, n = f[3], tonumber(f[4] or '0')
local hb = hbytes(tonumber(h))
local per_pool, cap = tonumber(ARGV[7]), 0
if per_pool > 0 then
  cap = math.max(per_pool * (tonumber(f[5] or '0') + tonumber(f[6] or '0')), tonumber(ARGV[8]))
  local m, k = n, 9
  while k <= #ARGV do
    if ARGV[k] == 'S' then m, k = m + #ARGV[k + 3] / w, k + 4
    elseif ARGV[k] == 'R' then m, k = m - #ARGV[k + 2] / w, k + 3
    else k = k + 1 end
  end
  if m > cap then return {-4, cap, 0} end
end
-- every key the fresh events touch, read with one MGET (in chunks) before any change
local evkeys, all = {}, {}
local i, seq = 9, tonumber(ARGV[3])
while i <= #ARGV do
  local op = ARGV[i]
  if seq > last and op ~= 'C' then
    local at = op == 'S' and i + 3 or i + 2
    local ks = keys_of(ARGV[at], w)
    evkeys[i] = ks
    for _, k in ipairs(ks) do all[#all + 1] = k end
    if op == 'S' and ARGV[i + 2] ~= '' then all[#all + 1] = ARGV[i + 2] end
  end
  i = i + (op == 'S' and 4 or op == 'R' and 3 or 1)
  seq = seq + 1
end
fetch(all)
local applied
i, applied, seq = 9, 0, tonumber(ARGV[3])
while i <= #ARGV do
  local op, fresh = ARGV[i], seq > last
  if op == 'S' then
    if fresh then
      local bits, parent = tonumber(ARGV[i + 1]), ARGV[i + 2]
      -- an orphan (its parent not held by this worker) is skipped
      if parent == '' or (cur[parent] and find(cur[parent], hb)) then
        local e = hb .. string.char(bits)
        for _, k in ipairs(evkeys[i]) do
          local nv, new = hold(cur[k], hb, bits, e)
          if nv then put(k, nv) end
          if new then n = n + 1 end
        end
      end
    end
    i = i + 4
  elseif op == 'R' then
    if fresh then
      local bits = tonumber(ARGV[i + 1])
      for _, k in ipairs(evkeys[i]) do
        local nv, gone = unhold(cur[k], hb, bits)
        if nv ~= nil then put(k, nv) end
        if gone then n = n - 1 end
      end
    end
    i = i + 3
  else
    if fresh then
      local old = h
      h = new_handle(ns, wid)
      retire(ns, old)
      hb, n = hbytes(tonumber(h)), 0
    end
    i = i + 1
  end
  if fresh then applied = applied + 1 end
  seq = seq + 1
end
if per_pool > 0 and n > cap then  -- nothing written: every entry of h is dropped anyway
  local old = h
  h = new_handle(ns, wid)
  retire(ns, old)
  redis.call('HSET', rk, 'seq', '0', 'h', h, 'n', 0)
  return {-4, cap, 1}
end
flush()
redis.call('HSET', rk, 'seq', ARGV[4], 'h', h, 'n', n)
return {1, applied, tonumber(ARGV[4])}
