-- One tag's part of a wave: hold and unhold entries of that tag's keys, in event order.
-- KEYS[1] = a key of the tag's slot (it routes the call; every key below has its slot)
-- ARGV[1] = KW (bytes of one block key), ARGV[2] = the batch's handles (3 bytes each),
-- ARGV[3] = the handle (1-based index) whose entry count is returned, ARGV[4] = the
-- batch's ticket (its begin step's), ARGV[5..] = the tag's part of each event, in event
-- order: 'S' (hold) or 'R' (unhold), handle index, tier bits, keys (concatenated)
-- The events of a handle fenced at or above the ticket are refused (handle_fence.py).
-- Returns the entries of handle ARGV[3] added minus removed.

--@include prelude

local w, hs, counted = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
--@include fence_check

local lists, all = {}, {}
for i = 5, #ARGV, 4 do
  local ks = keys_of(ARGV[i + 3], w)
  lists[i] = ks
  for _, k in ipairs(ks) do all[#all + 1] = k end
end
fetch(all)
local d = 0
for i = 5, #ARGV, 4 do
  local s, bits = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local hb = string.sub(hs, 3 * s - 2, 3 * s)
  local mine = s == counted
  if refused[s] then  -- a retired handle's late event: nothing
  elseif ARGV[i] == 'S' then
    local e = hb .. string.char(bits)
    for _, k in ipairs(lists[i]) do
      local nv, new = hold(cur[k], hb, bits, e)
      if nv then put(k, nv) end
      if new and mine then d = d + 1 end
    end
  else
    for _, k in ipairs(lists[i]) do
      local nv, gone = unhold(cur[k], hb, bits)
      if nv ~= nil then put(k, nv) end
      if gone and mine then d = d - 1 end
    end
  end
end
flush()
return d
