-- A heartbeat's lane part (the worker's lane; lanes.py), sent beside cluster_heartbeat.
-- KEYS[1] = the worker's lane
-- ARGV[1], ARGV[2] = total and tier blocks (stored for the cap's checks)
-- Returns {} without a lane, else {handle, incarnation, seq, generation ('' none), 1 when
-- a batch or snapshot stopped midway (pend older than PEND_STALE) else 0}.

--@include lane

local lk = KEYS[1]
local f = redis.call('HMGET', lk, 'h', 'inc', 'seq', 'g', 'pt')
if not f[1] then return {} end
redis.call('HSET', lk, 'total', ARGV[1], 'tiers', ARGV[2])
local stale = (f[5] and now_ms() - tonumber(f[5]) > PEND_STALE) and 1 or 0
return {f[1], f[2] or '0', f[3] or '0', f[4] or '', stale}
