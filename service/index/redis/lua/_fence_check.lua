-- Fragment: cluster_tag_write's fence check (needs `hs`, the batch's handles, before it).
-- KEYS[1] = a key of the tag's slot (its first 3 bytes name the tag's fence '{T}#')
-- ARGV[4] = the wave's ticket
-- refused[s] is true when handle s, or every handle ('*', the floor), is fenced at or above
-- the ticket (handle_fence.py).


local fq, t, refused = {'*'}, tonumber(ARGV[4]), {}
for s = 1, #hs / 3 do fq[s + 1] = string.sub(hs, 3 * s - 2, 3 * s) end
local fv = redis.call('HMGET', string.sub(KEYS[1], 1, 3) .. '#', unpack(fq))
local floor = tonumber(fv[1] or '0')
for s = 1, #fq - 1 do refused[s] = floor >= t or tonumber(fv[s + 1] or '0') >= t end
