-- A worker's heartbeat: its load and reported seq.
-- KEYS[1] = worker record
-- ARGV[1] = now ms, ARGV[2] = the worker's reported last seq, ARGV[3] = its incarnation,
-- ARGV[4..] = load field/values
-- Returns {0, 0, 0} for an unknown worker (the record is NOT created), {-1, 0, 0} for a
-- stale incarnation (nothing stored), else
-- {1, last applied seq, reported seq of the previous heartbeat}.


local f = redis.call('HMGET', KEYS[1], 'seq', 'rseq', 'inc', 'h')
if not f[4] then return {0, 0, 0} end
if (f[3] or '0') ~= ARGV[3] then return {-1, 0, 0} end
redis.call('HSET', KEYS[1], 'hb', ARGV[1], 'rseq', ARGV[2], unpack(ARGV, 4))
return {1, tonumber(f[1] or '0'), tonumber(f[2] or '0')}
