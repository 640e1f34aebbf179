-- Fence handles on one tag (handle_fence.py).
-- KEYS[1] = '{T}#', the prefix of the tag's fences (STRINGs '{T}#' .. 3-byte handle, and
-- '{T}#*' for every handle -> ticket; read by the write steps' MGET with the block keys)
-- ARGV[1] = the sweep cycle's handles (3 bytes each; '*': the floor), ARGV[2] = the cycle's
-- ticket tc (the recovery's: the counter's new start)
-- Each fence named becomes max(its fence, tc); returns how many.


local t, fs = tonumber(ARGV[2]), {}
if ARGV[1] == '*' then fs[1] = '*' end
for p = 1, #ARGV[1] - 2, 3 do fs[#fs + 1] = string.sub(ARGV[1], p, p + 2) end
for _, f in ipairs(fs) do
  local cur = redis.call('GET', KEYS[1] .. f)
  if not cur or tonumber(cur) < t then redis.call('SET', KEYS[1] .. f, ARGV[2]) end
end
return #fs
