-- Fragment: the worker-handle helpers (live maps, handles drawn and retired, record
-- keys), after _base.
-- KEYS, ARGV: none of its own (those of the script that includes it).

-- handles: drawn from the swept ones first; a retired one's entries are dead at once.
-- Scripts draw the new handle before they change anything (running out is an error).
-- Every change of a live map gives it a new version 'v' (server time and a count: unique
-- even across a flushed or restarted server), which lets lookups cache the map.
local function touch_live(ns)
  local lk, t = CTL .. 'live:' .. ns, redis.call('TIME')
  redis.call('HSET', lk, 'v', t[1] .. '.' .. t[2] .. '.' .. redis.call('HINCRBY', lk, 'c', 1))
end
local function new_handle(ns, wid)
  local h = redis.call('SPOP', CTL .. 'free')
  if not h then
    h = redis.call('INCR', CTL .. 'handles')
    if h > ${MAX_HANDLE} then
      redis.call('DECR', CTL .. 'handles')
      error('kvmesh: no worker handle left (the sweep is behind)')
    end
    h = tostring(h)
  end
  redis.call('HSET', CTL .. 'live:' .. ns, h, wid)
  touch_live(ns)
  return h
end
local function retire(ns, h)
  if h then
    redis.call('HDEL', CTL .. 'live:' .. ns, h)
    redis.call('SADD', CTL .. 'dead', h)
    touch_live(ns)
  end
end
local function record_key(ns, wid) return CTL .. 'w:' .. ns .. '|' .. wid end
