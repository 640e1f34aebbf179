-- Fragment: the writers' helpers (entries, the block-value cache, handles), after _base.
-- KEYS, ARGV: none of its own (those of the script that includes it).
-- Seqs and times travel as decimal strings and are stored verbatim (Lua numbers are
-- doubles: the service keeps seqs below 2**53). Incarnations are uint64, beyond a double's
-- exact range: they are stored and compared as canonical decimal strings (Python's
-- str(int)), never converted to numbers; a record without the field has incarnation '0'.
-- Handles are stored as decimal strings in records and control keys (Python reads those).

--@include base

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
    if h > ${MAX_HANDLE} then
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
