"""The Lua scripts of the redis backend that change workers and their entries (the layout
is in ``keys.py``; the provisional script in ``prov_script.py``, the sweep in
``sweep_script.py``; lookups run no script).

Every script is the shared PRELUDE (entry and handle helpers, the block-value cache) plus
its body.
Block keys travel as raw bytes, concatenated (KW bytes each). Seqs and times travel as
decimal strings and are stored verbatim (Lua numbers are doubles: the service keeps seqs
below 2**53). Incarnations are uint64, beyond a double's exact range: they are stored and
compared as canonical decimal strings (Python's ``str(int)``), never converted to numbers;
a record without the field has incarnation '0'. Handles are stored as decimal strings in
records and control keys (Python reads those), and as 3 raw bytes inside block values.
"""
from __future__ import annotations

from service.index.keys import CTL, ENTRY_BYTES, MAX_HANDLE

# Shared by every script (the provisional script too). Block keys come from the service,
# concatenated (KW bytes each: keys.block_key), so the tag rule lives in keys.py alone.
# A block value is a string of sorted 4-byte entries: handle (3 bytes) .. tier bits (1).
BASE = f"""
local CTL, EB = '{CTL}', {ENTRY_BYTES}
local function hnum(s, i)
  local a, b, c = string.byte(s, i, i + 2)
  return (a * 256 + b) * 256 + c
end
local function hbytes(n)
  return string.char(math.floor(n / 65536), math.floor(n / 256) % 256, n % 256)
end
""" + r"""
-- position of handle hb's entry in block value v (entries start at 1, 5, 9...), or nil
local function find(v, hb)
  local p = string.find(v, hb, 1, true)
  while p and (p - 1) % EB ~= 0 do p = string.find(v, hb, p + 1, true) end
  return p
end
"""

# The writers' helpers: entries, the block-value cache, handles.
PRELUDE = BASE + r"""
-- v with handle hb holding `bits` more: (new value or nil when unchanged, entry is new);
-- e = hb .. string.char(bits), the entry a new holder gets
local function hold(v, hb, bits, e)
  if not v then return e, true end
  local p = find(v, hb)
  if p then
    local m = string.byte(v, p + 3)
    local nm = bit.bor(m, bits)
    if nm == m then return nil, false end
    return string.sub(v, 1, p + 2) .. string.char(nm) .. string.sub(v, p + 4), false
  end
  -- sorted by handle: equal holder sets give equal strings (the walk's fast path)
  local at, n = 1, hnum(hb, 1)
  while at <= #v and hnum(v, at) < n do at = at + EB end
  if at > #v then return v .. e, true end
  return string.sub(v, 1, at - 1) .. e .. string.sub(v, at), true
end

-- v with `bits` of handle hb cleared: (new value, false = no holder left; nil when
-- unchanged), whether hb's entry is gone
local function unhold(v, hb, bits)
  if not v then return nil, false end
  local p = find(v, hb)
  if not p then return nil, false end
  local m = bit.band(string.byte(v, p + 3), bit.bnot(bits))
  if m ~= 0 then
    return string.sub(v, 1, p + 2) .. string.char(m) .. string.sub(v, p + 4), false
  end
  local nv = string.sub(v, 1, p - 1) .. string.sub(v, p + 4)
  if nv == '' then nv = false end
  return nv, true
end

-- block values read once per script and written once at its end
local cur, dirty, order = {}, {}, {}
local function fetch(keys)  -- cur[k] for every k of keys (false: no such key)
  for a = 1, #keys, 1000 do
    local b = math.min(#keys, a + 999)
    local vals = redis.call('MGET', unpack(keys, a, b))
    for j = a, b do
      if cur[keys[j]] == nil then cur[keys[j]] = vals[j - a + 1] end
    end
  end
end
local function put(k, v)
  cur[k] = v
  if not dirty[k] then
    dirty[k] = true
    order[#order + 1] = k
  end
end
local function flush()
  local sets, dels = {}, {}
  for _, k in ipairs(order) do
    if cur[k] then
      sets[#sets + 1] = k
      sets[#sets + 1] = cur[k]
    else
      dels[#dels + 1] = k
    end
  end
  for a = 1, #sets, 1000 do redis.call('MSET', unpack(sets, a, math.min(#sets, a + 999))) end
  for a = 1, #dels, 1000 do redis.call('DEL', unpack(dels, a, math.min(#dels, a + 999))) end
end
local function keys_of(ks, kw)  -- the list of keys of a concatenation
  local out = {}
  for a = 1, #ks, kw do out[#out + 1] = string.sub(ks, a, a + kw - 1) end
  return out
end

-- handles: drawn from the swept ones first; a retired one's entries are dead at once.
-- Scripts draw the new handle before they change anything (running out is an error).
-- Every change of a live map gives it a new version 'v' (server time and a count: unique
-- even across a flushed or restarted server), which lets lookups cache the map.
local function touch_live(ns)
  local lk, t = CTL .. 'live:' .. ns, redis.call('TIME')
  redis.call('HSET', lk, 'v', t[1] .. '.' .. t[2] .. '.' .. redis.call('HINCRBY', lk, 'c', 1))
end
local function new_handle(ns, wid)
  local h = redis.call('SPOP', CTL .. 'free')
  if not h then
    h = redis.call('INCR', CTL .. 'handles')
    if h > """ + str(MAX_HANDLE) + r""" then
      redis.call('DECR', CTL .. 'handles')
      error('kvmesh: no worker handle left (the sweep is behind)')
    end
    h = tostring(h)
  end
  redis.call('HSET', CTL .. 'live:' .. ns, h, wid)
  touch_live(ns)
  return h
end
local function retire(ns, h)
  if h then
    redis.call('HDEL', CTL .. 'live:' .. ns, h)
    redis.call('SADD', CTL .. 'dead', h)
    touch_live(ns)
  end
end
local function record_key(ns, wid) return CTL .. 'w:' .. ns .. '|' .. wid end
"""

# KEYS[1] = registry, KEYS[2] = the new record 'kvm:{ctl}:w:<ns>|<id>'
# ARGV[1] = worker id, ARGV[2] = ns, ARGV[3] = live-after ms ('': no takeover guard),
# ARGV[4] = the new address, ARGV[5] = the new credential fingerprint,
# ARGV[6..] = record field/value pairs
# Returns -1 (nothing changed) when the id's record heartbeated after ARGV[3] from another
# address or credential (a live worker holds the id); 1 when state of an earlier
# registration of this worker id was dropped, else 0. The new record gets a fresh handle
# (field 'h') and 'n' = 0 entries; an earlier registration's handle is retired.
REGISTER_STEPS = r"""
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
"""
REGISTER = PRELUDE + REGISTER_STEPS + "return had\n"

# KEYS[1] = worker record
# ARGV[1] = now ms, ARGV[2] = the worker's reported last seq, ARGV[3] = its incarnation,
# ARGV[4..] = load field/values
# Returns {0, 0, 0} for an unknown worker (the record is NOT created), {-1, 0, 0} for a
# stale incarnation (nothing stored), else
# {1, last applied seq, reported seq of the previous heartbeat}.
HEARTBEAT = r"""
local f = redis.call('HMGET', KEYS[1], 'seq', 'rseq', 'inc', 'h')
if not f[4] then return {0, 0, 0} end
if (f[3] or '0') ~= ARGV[3] then return {-1, 0, 0} end
redis.call('HSET', KEYS[1], 'hb', ARGV[1], 'rseq', ARGV[2], unpack(ARGV, 4))
return {1, tonumber(f[1] or '0'), tonumber(f[2] or '0')}
"""

# KEYS[1] = worker record
# ARGV[1] = ns, ARGV[2] = worker id, ARGV[3] = seq of the first event, ARGV[4] = seq of the
# last event, ARGV[5] = KW, the bytes of one block key, ARGV[6] = the worker's incarnation,
# ARGV[7], ARGV[8] = the block cap: per pool block, floor (BlockCap; per pool 0 = no cap),
# ARGV[9..] = the events, flattened (KEYS = the blocks' keys, concatenated):
#   'S' tierbits parent_key_or_empty KEYS   (BlockStored, chain order)
#   'R' tierbits KEYS                       (BlockRemoved)
#   'C'                                     (AllBlocksCleared: a fresh handle)
# Events with seq <= the record's seq were applied before (a retried batch): skipped.
# The block cap is max(per_pool * (the record's 'total' + 'tiers'), floor): a batch for
# which n (entries held) + stored - removed hashes exceeds it is refused before any work
# ({-4, cap, 0}); one that still ends over it (a backstop) drops all the worker's entries
# (a fresh handle) and resets its seq to 0 ({-4, cap, 1}: it must resync).
# Returns {status, applied, last seq}: status 1 applied, 0 duplicate, -1 gap, -2 unknown,
# -3 stale incarnation (nothing applied), -4 over the cap.
APPLY = PRELUDE + r"""
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
"""

# KEYS[1] = worker record
# ARGV[1] = ns, ARGV[2] = worker id, ARGV[3] = snapshot seq, ARGV[4] = KW (bytes of a
# block key), ARGV[5] = the blocks' keys (concatenated, distinct; orphans already dropped
# by the caller), ARGV[6] = their tier masks, one digit each, ARGV[7] = the worker's
# incarnation, ARGV[8], ARGV[9] = the block cap (as APPLY)
# The worker gets a fresh handle holding exactly the snapshot; the old one is retired.
# Returns the number of blocks indexed, -1 for an unknown worker, -2 for a stale incarnation,
# -3 - cap for a snapshot over the cap (nothing changed in these three cases).
SYNC = PRELUDE + r"""
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
"""

# KEYS[1] = registry, KEYS[2] = worker record
# ARGV[1] = ns, ARGV[2] = worker id, ARGV[3] = heartbeat deadline ms ('' = purge
# regardless of heartbeats)
# Returns 1 when purged (record gone, handle retired), 0 when unknown or it heartbeated
# at/after the deadline.
PURGE = PRELUDE + r"""
local f = redis.call('HMGET', KEYS[2], 'h', 'hb')
if not f[1] then return 0 end
if ARGV[3] ~= '' and tonumber(f[2] or '0') >= tonumber(ARGV[3]) then return 0 end
retire(ARGV[1], f[1])
redis.call('DEL', KEYS[2])
if redis.call('HGET', KEYS[1], ARGV[2]) == ARGV[1] then redis.call('HDEL', KEYS[1], ARGV[2]) end
return 1
"""
