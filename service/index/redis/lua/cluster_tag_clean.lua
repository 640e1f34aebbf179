-- Drop a sweep cycle's handles' entries from block keys of one tag's slot.
-- KEYS[1] = a key of the tag's slot
-- ARGV[1] = the cycle's handles (3 bytes each), ARGV[2..] = block keys of the slot (found
-- by SCAN)
-- A key left without an entry is deleted; returns how many entries were dropped.

--@include base
--@include drop_entries

local gone = {}
for p = 1, #ARGV[1], 3 do gone[string.sub(ARGV[1], p, p + 2)] = true end
return drop_entries(ARGV, 2, #ARGV, gone)
