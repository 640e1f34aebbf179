-- Store a sweep step's cursors (compare-and-set) or complete the cycle (cluster_upkeep.py).
-- KEYS[1] = the sweep state
-- ARGV[1] = cycle id, ARGV[2] = the 'c' the caller's cluster_sweep_begin saw ('' none),
-- then per primary: name, the cursor its SCAN started from ('done': not scanned), the
-- cursor it returned ('' none), its layout around the SCAN ('': unstable or changed
-- within the step)
-- A node whose layout differs from the one its scan started with (or is unstable) starts
-- its scan over, done or not; else its cursor moves on only from the cursor the caller
-- scanned from (another replica's step may have moved or reset it). Once every node is
-- done 'c' is set; a step that began after it (ARGV[2] = 'c') and found nothing changed
-- completes the cycle: its handles are free again.
-- Returns -1 (ignored: another cycle, or not fenced), 1 in progress, 2 complete.

--@include base

local S = KEYS[1]
if redis.call('HGET', S, 'id') ~= ARGV[1] or redis.call('HGET', S, 'f') ~= '1' then
  return -1
end
for i = 3, #ARGV, 4 do
  local n, from, nxt, L = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local cur = redis.call('HGET', S, n)
  local seen = redis.call('HGET', S, 'L' .. n)
  if not cur then  -- not a node of this cycle
  elseif L == '' or (seen and seen ~= L) then
    redis.call('HSET', S, n, '0')
    redis.call('HDEL', S, 'L' .. n, 'c')
  elseif cur == from and nxt ~= '' then
    if from == '0' then redis.call('HSET', S, 'L' .. n, L) end
    redis.call('HSET', S, n, nxt == '0' and 'done' or nxt)
  end
end
for n in string.gmatch(redis.call('HGET', S, 'nodes') or '', '%S+') do
  if redis.call('HGET', S, n) ~= 'done' then return 1 end
end
local c = redis.call('HGET', S, 'c')
if c and c == ARGV[2] then
  redis.call('SUNIONSTORE', CTL .. 'free', CTL .. 'free', CTL .. 'cycle')
  redis.call('DEL', CTL .. 'cycle', S)
  return 2
end
if not c then
  local t = redis.call('TIME')
  redis.call('HSET', S, 'c', t[1] .. '.' .. t[2])
end
return 1
