-- Point a worker's lane at a freshly drawn handle (the worker's own slot; lanes.py): after
-- a registration, a snapshot's begin step, an AllBlocksCleared event or the cap's backstop.
-- KEYS[1] = the lane 'kvm:lane:<ns>|<id>'
-- ARGV[1] = incarnation, ARGV[2] = handle, ARGV[3] = its ticket, ARGV[4] = seq, ARGV[5] =
-- generation ('' while a snapshot is written: set by its end step), ARGV[6] = pend token
-- ('' none), ARGV[7], ARGV[8] = total and tier blocks (the cap's)
-- Tickets grow with every draw, so a reset whose ticket is not above the lane's is of an
-- older draw than the lane's own and changes nothing (two resets racing land in draw
-- order). A batch in flight finds its pend gone: its end step answers superseded.
-- Returns 1, or 0 when superseded.

--@include lane

local lk = KEYS[1]
local tk = redis.call('HGET', lk, 'tk')
if tk and tonumber(tk) >= tonumber(ARGV[3]) then return 0 end
redis.call('DEL', lk)
redis.call('HSET', lk, 'inc', ARGV[1], 'h', ARGV[2], 'tk', ARGV[3], 'seq', ARGV[4], 'n', 0,
           'total', ARGV[7], 'tiers', ARGV[8])
if ARGV[5] ~= '' then redis.call('HSET', lk, 'g', ARGV[5]) end
if ARGV[6] ~= '' then redis.call('HSET', lk, 'pend', ARGV[6], 'pt', now_ms()) end
return 1
