-- Fragment: the helpers of a worker's lane steps and of the control slot's (now_ms,
-- cap_of, PEND_STALE); needs nothing before it.
-- KEYS, ARGV: none of its own (those of the script that includes it).
-- PEND_STALE: a heartbeat asks for a snapshot when pend is older than this (ms).

local PEND_STALE = ${PEND_STALE_MS}
local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end
local function cap_of(per_pool, floor, total, tiers)
  return math.max(per_pool * (tonumber(total or '0') + tonumber(tiers or '0')), floor)
end
