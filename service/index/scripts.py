"""The Lua scripts of the redis backend (the key layout is documented in ``redis.py``).

Every script is the shared PRELUDE (key builders and the entry helpers) plus its body. All
hashes travel as lowercase hex. Seqs and times travel as decimal strings and are stored
verbatim (Lua numbers are doubles: the service keeps seqs below 2**53). Incarnations are
uint64, beyond a double's exact range: they are stored and compared as canonical decimal
strings (Python's ``str(int)``), never converted to numbers; a record without the field has
incarnation '0'.
"""
from __future__ import annotations

# Key builders and entry helpers shared by the scripts.
#   cp   = chain prefix 'kvm:{<ns>|'  -> block key cp..root..'}:b:'..hash (STRING holders)
#   wid  = worker id;  held = the worker's 'kvm:{<ns>|w:<id>}:blocks' HASH hash -> root
#   holders = ';worker=mask;worker=mask' (mask: ONE digit of tier bits, 1 GPU 2 CPU 4 disk;
#             every entry starts with ';' so ';<id>=' finds exactly one worker's entry)
PRELUDE = r"""
local function block_key(cp, root, h) return cp .. root .. '}:b:' .. h end
local function worker_key(ns, wid) return 'kvm:{' .. ns .. '|w:' .. wid .. '}' end

local function holders(v)
  local t = {}
  if v then
    for w, m in string.gmatch(v, ';([^=;]+)=(%d)') do t[w] = tonumber(m) end
  end
  return t
end

local function save_holders(bk, t)
  local parts = {}
  for w, m in pairs(t) do parts[#parts + 1] = ';' .. w .. '=' .. m end
  table.sort(parts)  -- canonical: equal holder sets give equal strings (LOOKUP's fast path)
  if #parts == 0 then
    redis.call('DEL', bk)
  else
    redis.call('SET', bk, table.concat(parts))
  end
end

-- worker wid now holds block h (chain root `root`) on the tiers in `bits`
local function hold(cp, wid, held, h, root, bits)
  local r = redis.call('HGET', held, h)
  if not r then
    r = root
    redis.call('HSET', held, h, root)
  end
  local bk = block_key(cp, r, h)
  local t = holders(redis.call('GET', bk))
  t[wid] = bit.bor(t[wid] or 0, bits)
  save_holders(bk, t)
end

-- clear `bits` of worker wid on block h of chain `root`; returns true when no tier is left
local function unhold(cp, wid, root, h, bits)
  local bk = block_key(cp, root, h)
  local t = holders(redis.call('GET', bk))
  local left = bit.band(t[wid] or 0, bit.bnot(bits))
  if left == 0 then t[wid] = nil else t[wid] = left end
  save_holders(bk, t)
  return left == 0
end

-- worker wid no longer holds block h on the tiers in `bits`; no tier left: entry gone
local function forget(cp, wid, held, h, bits)
  local root = redis.call('HGET', held, h)
  if root and unhold(cp, wid, root, h, bits) then redis.call('HDEL', held, h) end
end

-- drop every entry of worker wid (its holder marks and its reverse index)
local function forget_all(cp, wid, held)
  local kv = redis.call('HGETALL', held)
  for i = 1, #kv, 2 do unhold(cp, wid, kv[i + 1], kv[i], 7) end
  redis.call('DEL', held)
end
"""

# KEYS[1] = registry 'kvm:workers' (HASH worker id -> ns)
# KEYS[2] = the new record 'kvm:{<ns>|w:<id>}', KEYS[3] = its reverse index (..':blocks')
# ARGV[1] = worker id, ARGV[2] = ns, ARGV[3] = live-after ms ('': no takeover guard),
# ARGV[4] = the new address, ARGV[5] = the new credential fingerprint,
# ARGV[6..] = record field/value pairs
# Returns -1 (nothing changed) when the id's record heartbeated after ARGV[3] from another
# address or credential (a live worker holds the id); 1 when state of an earlier
# registration of this worker id was dropped, else 0.
REGISTER = PRELUDE + r"""
local wid, ns = ARGV[1], ARGV[2]
local had = 0
local old = redis.call('HGET', KEYS[1], wid)
if old then
  local rk = worker_key(old, wid)
  local f = redis.call('HMGET', rk, 'hb', 'address', 'cred')
  if ARGV[3] ~= '' and f[1] and tonumber(f[1]) > tonumber(ARGV[3])
      and (f[2] ~= ARGV[4] or (f[3] or '') ~= ARGV[5]) then
    return -1
  end
  forget_all('kvm:{' .. old .. '|', wid, rk .. ':blocks')
  redis.call('DEL', rk)
  had = 1
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  forget_all('kvm:{' .. ns .. '|', wid, KEYS[3])
  had = 1
end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], wid, ns)
for i = 6, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
return had
"""

# KEYS[1] = worker record (KEYS[2], its reverse index, comes along unused: every per-worker
#           call passes both)
# ARGV[1] = now ms, ARGV[2] = the worker's reported last seq, ARGV[3] = its incarnation,
# ARGV[4..] = load field/values
# Returns {0, 0, 0} for an unknown worker (the record is NOT created), {-1, 0, 0} for a
# stale incarnation (nothing stored), else
# {1, last applied seq, reported seq of the previous heartbeat}.
HEARTBEAT = r"""
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 0, 0} end
if (redis.call('HGET', KEYS[1], 'inc') or '0') ~= ARGV[3] then return {-1, 0, 0} end
local seq = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
local prev = tonumber(redis.call('HGET', KEYS[1], 'rseq') or '0')
redis.call('HSET', KEYS[1], 'hb', ARGV[1], 'rseq', ARGV[2])
for i = 4, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
return {1, seq, prev}
"""

# KEYS[1] = worker record, KEYS[2] = its reverse index
# ARGV[1] = chain prefix 'kvm:{<ns>|', ARGV[2] = worker id,
# ARGV[3] = seq of the first event, ARGV[4] = seq of the last event,
# ARGV[5] = W, the hex width of one block hash, ARGV[6] = the worker's incarnation,
# ARGV[7], ARGV[8] = the block cap: per pool block, floor (BlockCap; per pool 0 = no cap),
# ARGV[9..] = the events, flattened (HASHES = the block hashes' hex, concatenated):
#   'S' tierbits parent_hex_or_empty HASHES   (BlockStored, chain order)
#   'R' tierbits HASHES                       (BlockRemoved)
#   'C'                                       (AllBlocksCleared)
# Events with seq <= the record's seq were applied before (a retried batch): skipped.
# The block cap is max(per_pool * (the record's 'total' + 'tiers'), floor): a batch for
# which indexed + stored - removed hashes exceeds it is refused before any work
# ({-4, cap, 0}); one that still ends over it (a backstop) drops all the worker's entries
# and resets its seq to 0 ({-4, cap, 1}: it must resync).
# Returns {status, applied, last seq}: status 1 applied, 0 duplicate, -1 gap, -2 unknown,
# -3 stale incarnation (nothing applied), -4 over the cap.
APPLY = PRELUDE + r"""
if redis.call('EXISTS', KEYS[1]) == 0 then return {-2, 0, 0} end
local cp, wid, held, w = ARGV[1], ARGV[2], KEYS[2], tonumber(ARGV[5])
local last = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
if (redis.call('HGET', KEYS[1], 'inc') or '0') ~= ARGV[6] then return {-3, 0, last} end
if tonumber(ARGV[4]) <= last then return {0, 0, last} end
if tonumber(ARGV[3]) > last + 1 then return {-1, 0, last} end
local per_pool, cap = tonumber(ARGV[7]), 0
if per_pool > 0 then
  cap = math.max(per_pool * (tonumber(redis.call('HGET', KEYS[1], 'total') or '0')
                             + tonumber(redis.call('HGET', KEYS[1], 'tiers') or '0')),
                 tonumber(ARGV[8]))
  local n, k = redis.call('HLEN', held), 9
  while k <= #ARGV do
    if ARGV[k] == 'S' then n, k = n + #ARGV[k + 3] / w, k + 4
    elseif ARGV[k] == 'R' then n, k = n - #ARGV[k + 2] / w, k + 3
    else k = k + 1 end
  end
  if n > cap then return {-4, cap, 0} end
end
local i, applied, seq = 9, 0, tonumber(ARGV[3])
while i <= #ARGV do
  local op, fresh = ARGV[i], seq > last
  if op == 'S' then
    local bits, parent, hs = tonumber(ARGV[i + 1]), ARGV[i + 2], ARGV[i + 3]
    local root = string.sub(hs, 1, w)
    if parent ~= '' then root = redis.call('HGET', held, parent) end
    if fresh and root then  -- no root: an orphan, its parent is not held by this worker
      for j = 1, #hs, w do hold(cp, wid, held, string.sub(hs, j, j + w - 1), root, bits) end
    end
    i = i + 4
  elseif op == 'R' then
    local bits, hs = tonumber(ARGV[i + 1]), ARGV[i + 2]
    if fresh then
      for j = 1, #hs, w do forget(cp, wid, held, string.sub(hs, j, j + w - 1), bits) end
    end
    i = i + 3
  else
    if fresh then forget_all(cp, wid, held) end
    i = i + 1
  end
  if fresh then applied = applied + 1 end
  seq = seq + 1
end
if per_pool > 0 and redis.call('HLEN', held) > cap then
  forget_all(cp, wid, held)
  redis.call('HSET', KEYS[1], 'seq', '0')
  return {-4, cap, 1}
end
redis.call('HSET', KEYS[1], 'seq', ARGV[4])
return {1, applied, tonumber(ARGV[4])}
"""

# KEYS[1] = worker record, KEYS[2] = its reverse index
# ARGV[1] = chain prefix, ARGV[2] = worker id, ARGV[3] = snapshot seq, ARGV[4] = W (hex
# width of a hash), ARGV[5] = block hashes (hex, concatenated), ARGV[6] = their chain roots
# (hex, concatenated, same order; resolved by the caller), ARGV[7] = their tier masks, one
# digit each, ARGV[8] = the worker's incarnation, ARGV[9], ARGV[10] = the block cap (as APPLY)
# Returns the number of blocks indexed, -1 for an unknown worker, -2 for a stale incarnation,
# -3 - cap for a snapshot over the cap (nothing changed in these three cases).
SYNC = PRELUDE + r"""
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if (redis.call('HGET', KEYS[1], 'inc') or '0') ~= ARGV[8] then return -2 end
local cp, wid, held, w = ARGV[1], ARGV[2], KEYS[2], tonumber(ARGV[4])
local hs, roots, masks = ARGV[5], ARGV[6], ARGV[7]
if tonumber(ARGV[9]) > 0 then
  local total = tonumber(redis.call('HGET', KEYS[1], 'total') or '0')
                + tonumber(redis.call('HGET', KEYS[1], 'tiers') or '0')
  local cap = math.max(tonumber(ARGV[9]) * total, tonumber(ARGV[10]))
  if #masks > cap then return -3 - cap end
end
forget_all(cp, wid, held)
for k = 1, #masks do
  local a = (k - 1) * w + 1
  local h, root = string.sub(hs, a, a + w - 1), string.sub(roots, a, a + w - 1)
  redis.call('HSET', held, h, root)
  local bk = block_key(cp, root, h)
  local t = holders(redis.call('GET', bk))
  t[wid] = tonumber(string.sub(masks, k, k))
  save_holders(bk, t)
end
redis.call('HSET', KEYS[1], 'seq', ARGV[3])
return #masks
"""

# KEYS[1] = registry, KEYS[2] = worker record, KEYS[3] = its reverse index
# ARGV[1] = worker id, ARGV[2] = chain prefix, ARGV[3] = ns,
# ARGV[4] = heartbeat deadline ms ('' = purge regardless of heartbeats)
# Returns 1 when purged, 0 when unknown or it heartbeated at/after the deadline.
PURGE = PRELUDE + r"""
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
if ARGV[4] ~= '' then
  local hb = tonumber(redis.call('HGET', KEYS[2], 'hb') or '0')
  if hb >= tonumber(ARGV[4]) then return 0 end
end
forget_all(ARGV[2], ARGV[1], KEYS[3])
redis.call('DEL', KEYS[2])
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[3] then redis.call('HDEL', KEYS[1], ARGV[1]) end
return 1
"""

# KEYS[1] = the chain's block-0 key 'kvm:{<ns>|<root>}:b:<root>': it pins the script to
#           the chain's slot; every key read carries the same hash tag:
#           'kvm:{<ns>|<root>}:b:<hash>'  holders ';worker=mask;...'
#           'kvm:{<ns>|<root>}:p:<hash>'  provisional holders ';worker|expiry_ms;...'
#           'kvm:{<ns>|<root>}:pm'        exists while any provisional key of the chain may
# ARGV[1] = the chain's key prefix 'kvm:{<ns>|<root>}:', ARGV[2] = now ms,
# ARGV[3] = W (hex width of a hash), ARGV[4] = the chain's block hashes from block 0 (hex,
# concatenated), ARGV[5] = k, the number of allowed workers (-1: any), ARGV[6 .. 5+k] = ids
# Block 0's holders start the candidate set; later blocks only test the candidates left
# (a plain find of ';<id>=' per candidate). Keys are read in growing chunks (MGET of 32,
# 64, ... keys) and the walk stops as soon as the last candidate dropped out.
# Returns {worker, blocks, gpu, cpu, disk, ...} for each worker matching >= 1 block.
LOOKUP = r"""
local kp, now, w, hs = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local k, n = tonumber(ARGV[5]), #ARGV[4] / tonumber(ARGV[3])
local allowed = nil
if k >= 0 then
  allowed = {}
  for i = 6, 5 + k do allowed[ARGV[i]] = true end
end
local has_prov = redis.call('EXISTS', kp .. 'pm') == 1
local active, nb, np, n_active, out = {}, {}, {}, 0, {}
local function tally(c, m)
  c[1] = c[1] + 1
  if bit.band(m, 1) ~= 0 then c[2] = c[2] + 1
  elseif bit.band(m, 2) ~= 0 then c[3] = c[3] + 1
  else c[4] = c[4] + 1 end
end
local function emit(wid, c)
  out[#out + 1] = wid
  for t = 1, 4 do out[#out + 1] = c[t] end
end
local prev_v, prev_pv, last_m, run = {}, {}, {}, 0  -- tables never equal a value
local function flush()  -- credit `run` more blocks to every candidate, at its last mask
  if run == 0 then return end
  for wid, c in pairs(active) do
    local m = last_m[wid]
    c[1] = c[1] + run
    if bit.band(m, 1) ~= 0 then c[2] = c[2] + run
    elseif bit.band(m, 2) ~= 0 then c[3] = c[3] + run
    else c[4] = c[4] + run end
  end
  run = 0
end
local i, chunk = 0, 32
while i < n do
  local last = math.min(n, i + chunk)
  local bkeys, pkeys = {}, {}
  for j = i, last - 1 do
    local h = string.sub(hs, j * w + 1, (j + 1) * w)
    bkeys[#bkeys + 1] = kp .. 'b:' .. h
    if has_prov then pkeys[#pkeys + 1] = kp .. 'p:' .. h end
  end
  local vals = redis.call('MGET', unpack(bkeys))
  local pvals = {}
  if has_prov then pvals = redis.call('MGET', unpack(pkeys)) end
  local j0 = 1
  if i == 0 then
    local here = {}
    if vals[1] then
      for wid, m in string.gmatch(vals[1], ';([^=;]+)=(%d)') do here[wid] = tonumber(m) end
    end
    if pvals[1] then
      for wid, exp in string.gmatch(pvals[1], ';([^|;]+)|(%d+)') do
        if tonumber(exp) > now and not here[wid] then here[wid] = 1 end
      end
    end
    for wid, m in pairs(here) do
      if allowed == nil or allowed[wid] then
        active[wid] = {0, 0, 0, 0}
        tally(active[wid], m)
        last_m[wid] = m
        nb[wid], np[wid] = ';' .. wid .. '=', ';' .. wid .. '|'
        n_active = n_active + 1
      end
    end
    if n_active == 0 then return out end
    j0 = 2
  end
  for j = j0, #bkeys do
    local v, pv = vals[j], pvals[j]
    if v == prev_v and pv == prev_pv then
      run = run + 1  -- same holder strings as the block before: same masks, count later
    else
      flush()
      prev_v, prev_pv = v, pv
      for wid, c in pairs(active) do
        local m = 0
        if v then
          local pos = string.find(v, nb[wid], 1, true)
          if pos then m = string.byte(v, pos + #nb[wid]) - 48 end
        end
        if m == 0 and pv then
          local pos = string.find(pv, np[wid], 1, true)
          if pos then
            local s = pos + #np[wid]
            local e = string.find(pv, ';', s, true)
            if tonumber(string.sub(pv, s, (e or 0) - 1)) > now then m = 1 end
          end
        end
        if m > 0 then
          last_m[wid] = m
          tally(c, m)
        else
          emit(wid, c)
          active[wid] = nil
          n_active = n_active - 1
        end
      end
    end
    if n_active == 0 then return out end
  end
  i = last
  chunk = math.min(chunk * 2, 2048)
end
flush()
for wid, c in pairs(active) do emit(wid, c) end
return out
"""

# KEYS[1] = the chain's block-0 key (pins the slot, as in LOOKUP)
# ARGV[1] = the chain's key prefix 'kvm:{<ns>|<root>}:', ARGV[2] = worker id,
# ARGV[3] = its expiry ms, ARGV[4] = now ms, ARGV[5] = key TTL ms, ARGV[6] = W (hex width),
# ARGV[7] = the block hashes the worker provisionally holds (hex, concatenated)
# Each 'kvm:{<ns>|<root>}:p:<hash>' STRING = ';worker|expiry_ms;...': the worker's entry is
# set/renewed, other unexpired holders kept, expired ones dropped; the key gets the TTL, and
# so does the chain's marker 'kvm:{<ns>|<root>}:pm' (lookups skip provisional keys without it).
PROVISIONAL = r"""
local kp, wid, now, w, hs = ARGV[1], ARGV[2], tonumber(ARGV[4]), tonumber(ARGV[6]), ARGV[7]
for a = 1, #hs, w do
  local pk = kp .. 'p:' .. string.sub(hs, a, a + w - 1)
  local v = ';' .. wid .. '|' .. ARGV[3]
  local old = redis.call('GET', pk)
  if old then
    for other, exp in string.gmatch(old, ';([^|;]+)|(%d+)') do
      if other ~= wid and tonumber(exp) > now then v = v .. ';' .. other .. '|' .. exp end
    end
  end
  redis.call('SET', pk, v, 'PX', ARGV[5])
end
redis.call('SET', kp .. 'pm', '1', 'PX', ARGV[5])
return 0
"""
