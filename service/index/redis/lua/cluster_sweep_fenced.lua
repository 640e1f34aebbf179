-- Mark a sweep cycle fenced: every tag's fence written, its scan steps may run.
-- KEYS[1] = the sweep state
-- ARGV[1] = cycle id
-- Returns 1, or 0 for another cycle.

--@include base

if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'f', '1')
return 1
