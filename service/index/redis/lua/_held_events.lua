-- Fragment: apply_held(first), a wave's events on the keys of one node, after _prelude.
-- KEYS: none read (those of the script that includes it). Needs, before it: `w` (KW, the
-- bytes of one block key), `hs` (the wave's handles, 3 bytes each, one per batch),
-- `tickets` (per batch, the ticket drawn with its handle: the lane's `tk`).
-- ARGV[first..] = per event: 'S' (hold) or 'R' (unhold), batch index, tier bits, keys
-- (concatenated; of any tags the node serves)
-- Every command touches one slot (per tag one MGET of its fences '{T}#*', '{T}#<handle>'
-- and its keys, one MSET and, for keys left empty, one DEL), so the keys may lie in several
-- slots of the node (the scripts declare no flags). Everything is read before anything is
-- written, so a call that meets a key its node does not serve (a slot moved)
-- fails having changed nothing. The events of a batch whose handle is fenced on a key's tag
-- at or above the batch's ticket are refused there (handle_fence.py).
-- Returns per batch the entries of its handle it added minus those it removed.


local function apply_held(first)
  local fq, fenced, lists, by, pre, any, d = {'*'}, {}, {}, {}, {}, false, {}
  for s = 1, #hs / 3 do fq[s + 1], d[s] = string.sub(hs, 3 * s - 2, 3 * s), 0 end
  for i = first, #ARGV, 4 do
    local ks = keys_of(ARGV[i + 3], w)
    lists[i] = ks
    for _, k in ipairs(ks) do
      if not pre[k] then
        local p = string.sub(k, 1, 3)
        local g = by[p]
        if not g then  -- the tag's fences, read by the same MGET as its keys
          g = {}
          for s = 1, #fq do g[s] = p .. '#' .. fq[s] end
          by[p] = g
        end
        pre[k] = p
        g[#g + 1] = k
      end
    end
  end
  for _, g in pairs(by) do fetch(g) end  -- one MGET per slot
  for p in pairs(by) do
    local floor, r = tonumber(cur[p .. '#*'] or '0'), {}
    for s = 1, #fq - 1 do
      r[s] = floor >= tickets[s] or tonumber(cur[p .. '#' .. fq[s + 1]] or '0') >= tickets[s]
      any = any or r[s]
    end
    fenced[p] = r
  end
  for i = first, #ARGV, 4 do
    local s, bits = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
    local hb = string.sub(hs, 3 * s - 2, 3 * s)
    local hold_it = ARGV[i] == 'S'
    local e = hb .. string.char(bits)
    for _, k in ipairs(lists[i]) do
      if any and fenced[pre[k]][s] then  -- refused: a retired handle's late event
      elseif hold_it then
        local nv, new = hold(cur[k], hb, bits, e)
        if nv then put(k, nv) end
        if new then d[s] = d[s] + 1 end
      else
        local nv, gone = unhold(cur[k], hb, bits)
        if nv ~= nil then put(k, nv) end
        if gone then d[s] = d[s] - 1 end
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
