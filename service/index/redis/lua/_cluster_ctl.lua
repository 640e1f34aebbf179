-- Fragment: the control slot's helpers on a Redis Cluster (_base, _handles, _ticket, GEN, BUSY,
-- now_ms, cap_of); every begin/end step starts with it.
-- KEYS, ARGV: none of its own (those of the script that includes it).
-- PEND_STALE: a heartbeat asks for a snapshot when pend is older than this (ms).

--@include base
--@include handles

local GEN, BUSY, PEND_STALE = CTL .. 'gen', CTL .. 'busy', ${PEND_STALE_MS}

--@include ticket

local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end
local function cap_of(per_pool, floor, total, tiers)
  return math.max(per_pool * (tonumber(total or '0') + tonumber(tiers or '0')), floor)
end
