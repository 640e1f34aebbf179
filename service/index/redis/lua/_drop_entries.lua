-- Fragment: drop_entries(keys, first, last, gone), after _base (it needs EB).
-- KEYS, ARGV: none of its own (those of the script that includes it).
-- The entries of the handles in the set `gone` (3-byte handle -> true) dropped from the
-- block keys keys[first..last] (MGET in chunks of 1000 keys); a key left without an
-- entry is deleted. Returns how many entries were dropped.


local function drop_entries(keys, first, last, gone)
  local dropped = 0
  for a = first, last, 1000 do
    local b = math.min(last, a + 999)
    local vals = redis.call('MGET', unpack(keys, a, b))
    for j = a, b do
      local v = vals[j - a + 1]
      if v then
        local keep = {}
        for p = 1, #v, EB do
          if gone[string.sub(v, p, p + 2)] then dropped = dropped + 1
          else keep[#keep + 1] = string.sub(v, p, p + EB - 1) end
        end
        if #keep == 0 then redis.call('DEL', keys[j])
        elseif #keep * EB < #v then redis.call('SET', keys[j], table.concat(keep)) end
      end
    end
  end
  return dropped
end
