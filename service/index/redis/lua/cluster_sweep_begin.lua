-- Start (or resume) a sweep cycle on a Redis Cluster (control slot; cluster_upkeep.py).
-- KEYS[1] = the sweep state 'kvm:{ctl}:sweep' (HASH: 'id', 'tc' (the ticket counter when
-- it started: its fence), 'f' once every tag is fenced, 'nodes' (the primaries' names,
-- space separated), per node its SCAN cursor or 'done' and 'L' .. node (the node's layout
-- when its scan started: sweep_layout.py), 'c' (set when every node was done))
-- ARGV = the names of the cluster's primaries
-- Starts a cycle when none runs and some handle is retired (the dead set moves to the cycle
-- set; a batch still writing one is refused by the fences: handle_fence.py); restarts
-- every cursor when the primaries changed.
-- Returns {} when idle, else {id, {field, value, ...}, handles}.

--@include cluster_ctl

local S, DEAD, CYCLE = KEYS[1], CTL .. 'dead', CTL .. 'cycle'
local id = redis.call('HGET', S, 'id')
if not id then
  if redis.call('SCARD', DEAD) == 0 and redis.call('SCARD', CYCLE) == 0 then return {} end
  redis.call('SUNIONSTORE', CYCLE, CYCLE, DEAD)
  redis.call('DEL', DEAD)
  local t = redis.call('TIME')
  id = t[1] .. '.' .. t[2]
  redis.call('HSET', S, 'id', id, 'tc', redis.call('GET', TICKET) or '0', 'nodes', '')
end
if not redis.call('HGET', S, 'tc') then  -- a cycle an older version began: fenced from now
  redis.call('HSET', S, 'tc', redis.call('GET', TICKET) or '0')
end
local names = table.concat(ARGV, ' ')
local was = redis.call('HGET', S, 'nodes') or ''
if was ~= names then  -- a new cycle, or the primaries changed: every scan starts over
  for n in string.gmatch(was, '%S+') do redis.call('HDEL', S, n, 'L' .. n) end
  redis.call('HDEL', S, 'c')
  for i = 1, #ARGV do redis.call('HSET', S, ARGV[i], '0') end
  redis.call('HSET', S, 'nodes', names)
end
return {id, redis.call('HGETALL', S), redis.call('SMEMBERS', CYCLE)}
