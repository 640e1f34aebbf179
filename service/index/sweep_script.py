"""The redis backend's sweep script: it deletes the entries of retired handles (layout:
``keys.py``; the shared Lua helpers ``BASE``: ``scripts.py``; the caller:
``RedisBackend.sweep``, run by the service's janitor)."""
from __future__ import annotations

from service.index.scripts import BASE

# The entries of the handles in the set ``gone`` (3-byte handle -> true) dropped from the
# block keys ``keys[first..last]`` (MGET in chunks of 1000 keys); a key left without an
# entry is deleted. Returns how many entries were dropped. Needs ``BASE`` (``EB``) before.
DROP_ENTRIES = r"""
local function drop_entries(keys, first, last, gone)
  local dropped = 0
  for a = first, last, 1000 do
    local b = math.min(last, a + 999)
    local vals = redis.call('MGET', unpack(keys, a, b))
    for j = a, b do
      local v = vals[j - a + 1]
      if v then
        local keep = {}
        for p = 1, #v, EB do
          if gone[string.sub(v, p, p + 2)] then dropped = dropped + 1
          else keep[#keep + 1] = string.sub(v, p, p + EB - 1) end
        end
        if #keep == 0 then redis.call('DEL', keys[j])
        elseif #keep * EB < #v then redis.call('SET', keys[j], table.concat(keep)) end
      end
    end
  end
  return dropped
end
"""

# KEYS[1] = sweep state 'kvm:{ctl}:sweep' (HASH: cursor), KEYS[2] = dead set, KEYS[3] = the
# running cycle's set, KEYS[4] = free set
# ARGV[1] = keys per SCAN step (COUNT)
# One step of the sweep: a cycle starts (when none runs and some handle was retired) by
# moving the dead set into the cycle set; each step SCANs the next block keys and drops the
# cycle's handles' entries from them (a key left without an entry is deleted). When the
# SCAN cursor comes back to 0, every block key that existed while the cycle ran was
# visited, and none can have gained an entry of a handle retired before the cycle began:
# the cycle's handles go to the free set. Handles retired during a cycle wait for the next.
# Returns {state, keys visited, entries dropped}: state 0 idle (nothing retired), 1 cycle
# in progress, 2 cycle complete.
SWEEP = BASE + DROP_ENTRIES + r"""
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
"""
