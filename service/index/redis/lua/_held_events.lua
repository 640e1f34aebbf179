-- Fragment: apply_held(first), a wave's events on the keys of one node, after _prelude.
-- KEYS: none read (those of the script that includes it). Needs, before it: `w` (KW, the
-- bytes of one block key), `hs` (the batch's handles, 3 bytes each), `counted` (the handle
-- whose entry count is returned), `ticket` (the batch's begin step's).
-- ARGV[first..] = per event, in event order: 'S' (hold) or 'R' (unhold), handle index,
-- tier bits, keys (concatenated; of any tags the node serves)
-- Every command touches one slot (a read, a write and a fence read per tag), so the keys
-- may lie in several slots of the node (the scripts declare no flags). Everything is read (each tag's fence '{T}#', each key) before
-- anything is written, so a call that meets a key its node does not serve (a slot moved)
-- fails having changed nothing. The events of a handle fenced on a key's tag at or above
-- the ticket are refused there (handle_fence.py).
-- Returns the entries of handle `counted` added minus removed.


local function apply_held(first)
  local fq, fenced, lists, by, pre, any = {'*'}, {}, {}, {}, {}, false
  for s = 1, #hs / 3 do fq[s + 1] = string.sub(hs, 3 * s - 2, 3 * s) end
  for i = first, #ARGV, 4 do
    local ks = keys_of(ARGV[i + 3], w)
    lists[i] = ks
    for _, k in ipairs(ks) do
      if not pre[k] then
        local p = string.sub(k, 1, 3)
        local g = by[p]
        if not g then
          local fv, r = redis.call('HMGET', p .. '#', unpack(fq)), {}
          local floor = tonumber(fv[1] or '0')
          for s = 1, #fq - 1 do
            r[s] = floor >= ticket or tonumber(fv[s + 1] or '0') >= ticket
            any = any or r[s]
          end
          fenced[p] = r
          g = {}
          by[p] = g
        end
        pre[k] = p
        g[#g + 1] = k
      end
    end
  end
  for _, g in pairs(by) do fetch(g) end  -- one MGET per slot
  local d = 0
  for i = first, #ARGV, 4 do
    local s, bits = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
    local hb = string.sub(hs, 3 * s - 2, 3 * s)
    local mine, hold_it = s == counted, ARGV[i] == 'S'
    local e = hb .. string.char(bits)
    for _, k in ipairs(lists[i]) do
      if any and fenced[pre[k]][s] then  -- refused: a retired handle's late event
      elseif hold_it then
        local nv, new = hold(cur[k], hb, bits, e)
        if nv then put(k, nv) end
        if new and mine then d = d + 1 end
      else
        local nv, gone = unhold(cur[k], hb, bits)
        if nv ~= nil then put(k, nv) end
        if gone and mine then d = d - 1 end
      end
    end
  end
  local sets, dels = {}, {}  -- one MSET and one DEL per slot
  for _, k in ipairs(order) do
    local p, v = pre[k], cur[k]
    if v then
      local g = sets[p] or {}
      sets[p] = g
      g[#g + 1] = k
      g[#g + 1] = v
    else
      local g = dels[p] or {}
      dels[p] = g
      g[#g + 1] = k
    end
  end
  for _, g in pairs(sets) do
    for a = 1, #g, 1000 do redis.call('MSET', unpack(g, a, math.min(#g, a + 999))) end
  end
  for _, g in pairs(dels) do
    for a = 1, #g, 1000 do redis.call('DEL', unpack(g, a, math.min(#g, a + 999))) end
  end
  return d
end
