-- One step of the sweep (a single server): drop retired handles' entries.
-- KEYS[1] = sweep state 'kvm:{ctl}:sweep' (HASH: cursor), KEYS[2] = dead set, KEYS[3] = the
-- running cycle's set, KEYS[4] = free set
-- ARGV[1] = keys per SCAN step (COUNT)
-- A cycle starts (when none runs and some handle was retired) by moving the dead set into
-- the cycle set; each step SCANs the next block keys and drops the cycle's handles'
-- entries from them (a key left without an entry is deleted). When the SCAN cursor comes
-- back to 0, every block key that existed while the cycle ran was visited, and none can
-- have gained an entry of a handle retired before the cycle began: the cycle's handles go
-- to the free set. Handles retired during a cycle wait for the next.
-- Returns {state, keys visited, entries dropped}: state 0 idle (nothing retired), 1 cycle
-- in progress, 2 cycle complete.

--@include base
--@include drop_entries

local cursor = redis.call('HGET', KEYS[1], 'cursor')
if not cursor then
  if redis.call('SCARD', KEYS[2]) == 0 then return {0, 0, 0} end
  redis.call('SUNIONSTORE', KEYS[3], KEYS[3], KEYS[2])
  redis.call('DEL', KEYS[2])
  cursor = '0'
end
local gone = {}
for _, h in ipairs(redis.call('SMEMBERS', KEYS[3])) do gone[hbytes(tonumber(h))] = true end
local res = redis.call('SCAN', cursor, 'MATCH', '{?}*', 'COUNT', ARGV[1])
local blocks = {}
for _, key in ipairs(res[2]) do
  if #key == 19 or #key == 35 then blocks[#blocks + 1] = key end  -- '{T}' .. 16 or 32 bytes
end
local dropped = drop_entries(blocks, 1, #blocks, gone)
if res[1] == '0' then
  redis.call('SUNIONSTORE', KEYS[4], KEYS[4], KEYS[3])
  redis.call('DEL', KEYS[3], KEYS[1])
  return {2, #res[2], dropped}
end
redis.call('HSET', KEYS[1], 'cursor', res[1])
return {1, #res[2], dropped}
