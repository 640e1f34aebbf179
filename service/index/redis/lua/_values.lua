-- Fragment: the block-value helpers (entries, the block-value cache), after _base.
-- KEYS, ARGV: none of its own (those of the script that includes it).

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
