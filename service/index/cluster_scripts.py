"""The Lua scripts of the index on a multi-shard Redis Cluster (``cluster.py``): each touches
ONE slot, the control slot ``{ctl}`` or one block tag's slot (layout: ``keys.py``; the
shared helpers ``PRELUDE``: ``scripts.py``).

A multi-slot operation is a *begin* step on the control slot, one *wave* of tag steps (one
script per tag, every shard in parallel), and an *end* step on the control slot:

- begin checks what the single-server script checks, draws and retires handles, and marks
  the record ``pend`` (this operation's token, ``pt`` its server time): while it is set, an
  event batch of the worker is answered GAP (a resync), so no two writers of one worker's
  entries ever overlap, and one that stopped midway (a shard down, a replica gone) is
  repaired by the snapshot it asks for. The handles it writes are marked *busy*
  (``kvm:{ctl}:busy``, ZSET ``handle:token`` -> server ms) until its end step, so the sweep
  waits for a wave that may still write a retired handle (a write after a retire is
  harmless for readers, who count live handles only, but the sweep must have visited it);
  begin also draws the batch's *ticket*, which its wave carries.
- the wave's tag steps (``TAG_WRITE``) hold and unhold entries of that tag's keys, in event
  order, and return the entries they added minus removed for the handle whose count the
  record keeps; an event of a handle the sweep fenced at or above the ticket is refused,
  so a wave stalled past the busy mark's 60 s never writes a handle swept and drawn again
  (``handle_fence.py``).
- end stores seq and ``n`` and clears ``pend`` only when ``pend`` is still its token.

``kvm:{ctl}:gen`` names the block shards' generation: ``LOST`` moves it when a shard comes
back empty or older (its tags' sentinels ``{T}!`` gone, or naming another server process:
``shard_identity.py``), and a record whose ``g`` (the
generation of its last snapshot) differs is asked for a snapshot (heartbeat, events).
Without ``gen`` the control slot itself was lost: registration is refused until the
service's recovery has deleted every block key (handles restart from 1, so an old entry
would otherwise count for a new worker).
"""
from __future__ import annotations

from service.index.handle_fence import FENCE_CHECK_LUA, TAG_FENCE, TICKET_LUA
from service.index.prov_script import PROVISIONAL_KEYS
from service.index.scripts import BASE, PRELUDE, REGISTER_STEPS
from service.index.sweep_script import DROP_ENTRIES

__all__ = ["APPLY_BEGIN", "APPLY_END", "BUSY_MS", "HEARTBEAT", "LOST", "PEND_STALE_MS",
           "PROVISIONAL_KEYS", "REGISTER", "SWEEP_BEGIN", "SWEEP_STEP", "SYNC_BEGIN",
           "SYNC_END", "SWEEP_FENCED", "TAG_CLEAN", "TAG_FENCE", "TAG_WRITE"]

BUSY_MS = 60_000        # a busy mark older than this is of a writer that died midway
PEND_STALE_MS = 10_000  # a heartbeat asks for a snapshot when pend is older than this

_CTL = PRELUDE + f"""
local GEN, BUSY, PEND_STALE = CTL .. 'gen', CTL .. 'busy', {PEND_STALE_MS}
""" + TICKET_LUA + r"""
local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end
local function cap_of(per_pool, floor, total, tiers)
  return math.max(per_pool * (tonumber(total or '0') + tonumber(tiers or '0')), floor)
end
"""

# KEYS[1] = registry, KEYS[2] = the new record (as scripts.REGISTER, same ARGV)
# Returns -2 (nothing changed) while the control slot has no generation (lost: the service
# recovers first), else as REGISTER; the record gets 'g', the current generation.
REGISTER = _CTL + r"""
local gen = redis.call('GET', GEN)
if not gen then return -2 end
""" + REGISTER_STEPS + r"""
redis.call('HSET', KEYS[2], 'g', gen)
return had
"""

# KEYS[1] = worker record; ARGV as scripts.HEARTBEAT. Returns as HEARTBEAT, but with last
# seq -1 (below anything reported: the service asks for a snapshot) when a shard was lost
# since the worker's last snapshot or an operation of it stopped midway.
HEARTBEAT = _CTL + r"""
local f = redis.call('HMGET', KEYS[1], 'seq', 'rseq', 'inc', 'h', 'g', 'pt')
if not f[4] then return {0, 0, 0} end
if (f[3] or '0') ~= ARGV[3] then return {-1, 0, 0} end
redis.call('HSET', KEYS[1], 'hb', ARGV[1], 'rseq', ARGV[2], unpack(ARGV, 4))
local seq = tonumber(f[1] or '0')
if f[5] ~= redis.call('GET', GEN) or (f[6] and now_ms() - tonumber(f[6]) > PEND_STALE) then
  seq = -1
end
return {1, seq, tonumber(f[2] or '0')}
"""

# KEYS[1] = worker record
# ARGV[1] = ns, ARGV[2] = worker id, ARGV[3] = first seq, ARGV[4] = last seq, ARGV[5] =
# incarnation, ARGV[6], ARGV[7] = block cap (per pool, floor), ARGV[8] = stored minus
# removed hashes of the whole batch (the cap check, as APPLY), ARGV[9] = token,
# ARGV[10] = the seqs of the batch's Cleared events, space separated
# Returns APPLY's answers for unknown (-2), stale (-3), duplicate (0), gap (-1, also while
# pend is set or the generation moved) and over the cap (-4, nothing changed); else
# {1, last seq, ticket, handles...}: the batch's ticket (its wave carries it:
# ``handle_fence.py``), the record's handle, then one fresh handle per fresh Cleared (each
# retires the one before; the record names the last, with n = 0 when it is fresh).
APPLY_BEGIN = _CTL + r"""
local rk = KEYS[1]
local f = redis.call('HMGET', rk, 'seq', 'inc', 'h', 'n', 'total', 'tiers', 'pend', 'g')
if not f[3] then return {-2, 0, 0} end
local last = tonumber(f[1] or '0')
if (f[2] or '0') ~= ARGV[5] then return {-3, 0, last} end
if tonumber(ARGV[4]) <= last then return {0, 0, last} end
if tonumber(ARGV[3]) > last + 1 then return {-1, 0, last} end
if f[7] or f[8] ~= redis.call('GET', GEN) then return {-1, 0, last} end
local per_pool = tonumber(ARGV[6])
if per_pool > 0 then
  local cap = cap_of(per_pool, tonumber(ARGV[7]), f[5], f[6])
  if tonumber(f[4] or '0') + tonumber(ARGV[8]) > cap then return {-4, cap, 0} end
end
local hs = {f[3]}
for s in string.gmatch(ARGV[10], '%d+') do
  if tonumber(s) > last then
    hs[#hs + 1] = new_handle(ARGV[1], ARGV[2])
    retire(ARGV[1], hs[#hs - 1])
  end
end
local now = now_ms()
for _, h in ipairs(hs) do redis.call('ZADD', BUSY, now, h .. ':' .. ARGV[9]) end
if #hs > 1 then redis.call('HSET', rk, 'h', hs[#hs], 'n', 0) end
redis.call('HSET', rk, 'pend', ARGV[9], 'pt', now)
return {1, last, ticket(), unpack(hs)}
"""

# KEYS[1] = worker record
# ARGV[1] = ns, ARGV[2] = worker id, ARGV[3] = token, ARGV[4] = incarnation, ARGV[5] = last
# seq, ARGV[6] = entries added minus removed for the record's handle, ARGV[7], ARGV[8] =
# block cap, ARGV[9..] = the busy marks to drop
# Returns APPLY's answers: {1, 0, last seq}, {-2, 0, 0} unknown, {-3, 0, seq} stale, {-1, 0,
# seq} superseded (pend is not this batch's: a snapshot replaced it, or the record is new),
# {-4, cap, 1} over the cap (a fresh handle, seq 0: resync).
APPLY_END = _CTL + r"""
local rk = KEYS[1]
for i = 9, #ARGV do redis.call('ZREM', BUSY, ARGV[i]) end
local f = redis.call('HMGET', rk, 'pend', 'inc', 'h', 'n', 'total', 'tiers', 'seq')
if not f[3] then return {-2, 0, 0} end
local last = tonumber(f[7] or '0')
if (f[2] or '0') ~= ARGV[4] then return {-3, 0, last} end
if f[1] ~= ARGV[3] then return {-1, 0, last} end
redis.call('HDEL', rk, 'pend', 'pt')
local n, per_pool = tonumber(f[4] or '0') + tonumber(ARGV[6]), tonumber(ARGV[7])
if per_pool > 0 then
  local cap = cap_of(per_pool, tonumber(ARGV[8]), f[5], f[6])
  if n > cap then  -- the backstop: every entry of the handle is dropped
    local h = new_handle(ARGV[1], ARGV[2])
    retire(ARGV[1], f[3])
    redis.call('HSET', rk, 'seq', '0', 'h', h, 'n', 0)
    return {-4, cap, 1}
  end
end
redis.call('HSET', rk, 'seq', ARGV[5], 'n', n)
return {1, 0, tonumber(ARGV[5])}
"""

# KEYS[1] = worker record
# ARGV[1] = ns, ARGV[2] = worker id, ARGV[3] = incarnation, ARGV[4], ARGV[5] = block cap,
# ARGV[6] = blocks in the snapshot, ARGV[7] = token, ARGV[8] = snapshot seq
# Returns {-1} unknown, {-2} stale, {-3 - cap} over the cap (nothing changed), else
# {1, fresh handle, generation, ticket}: the old handle is retired, the record holds the fresh one
# (n = 0 until the end step), seq = the snapshot's, pend = token (a pend left by another
# operation is taken over: its end step will find it gone).
SYNC_BEGIN = _CTL + r"""
local rk = KEYS[1]
local f = redis.call('HMGET', rk, 'inc', 'h', 'total', 'tiers')
if not f[2] then return {-1} end
if (f[1] or '0') ~= ARGV[3] then return {-2} end
local per_pool = tonumber(ARGV[4])
if per_pool > 0 then
  local cap = cap_of(per_pool, tonumber(ARGV[5]), f[3], f[4])
  if tonumber(ARGV[6]) > cap then return {-3 - cap} end
end
local h = new_handle(ARGV[1], ARGV[2])
retire(ARGV[1], f[2])
local now = now_ms()
redis.call('ZADD', BUSY, now, h .. ':' .. ARGV[7])
redis.call('HSET', rk, 'h', h, 'n', 0, 'seq', ARGV[8], 'pend', ARGV[7], 'pt', now)
return {1, h, redis.call('GET', GEN) or '', ticket()}
"""

# KEYS[1] = worker record
# ARGV[1] = token, ARGV[2] = incarnation, ARGV[3] = blocks indexed, ARGV[4] = the
# generation SYNC_BEGIN saw, ARGV[5] = the busy mark to drop
# Returns the blocks indexed; -1 unknown, -2 stale, -4 superseded (another snapshot or a
# registration replaced this one).
SYNC_END = _CTL + r"""
local rk = KEYS[1]
redis.call('ZREM', BUSY, ARGV[5])
local f = redis.call('HMGET', rk, 'pend', 'inc', 'h')
if not f[3] then return -1 end
if (f[2] or '0') ~= ARGV[2] then return -2 end
if f[1] ~= ARGV[1] then return -4 end
redis.call('HDEL', rk, 'pend', 'pt')
redis.call('HSET', rk, 'n', ARGV[3], 'g', ARGV[4])
return tonumber(ARGV[3])
"""

# KEYS[1] = 'kvm:{ctl}:gen'; ARGV[1] = the generation the caller read after it saw a
# tag's sentinel gone or another identity serving it. Moves the generation (every worker
# then resyncs) unless another replica moved it since; returns the current one, or false
# when there is none (the control slot was lost: recovery, not this).
LOST = BASE + r"""
local g = redis.call('GET', KEYS[1])
if g and g == ARGV[1] then
  local t = redis.call('TIME')
  g = t[1] .. '.' .. t[2]
  redis.call('SET', KEYS[1], g)
end
return g
"""

# KEYS[1] = a key of the tag's slot (it routes the call; every key below has its slot)
# ARGV[1] = KW (bytes of one block key), ARGV[2] = the batch's handles (3 bytes each),
# ARGV[3] = the handle (1-based index) whose entry count is returned, ARGV[4] = the
# batch's ticket (its begin step's), ARGV[5..] = the tag's part of each event, in event
# order: 'S' (hold) or 'R' (unhold), handle index, tier bits, keys (concatenated)
# The events of a handle fenced at or above the ticket are refused (``handle_fence.py``).
# Returns the entries of handle ARGV[3] added minus removed.
TAG_WRITE = PRELUDE + r"""
local w, hs, counted = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
""" + FENCE_CHECK_LUA + r"""
local lists, all = {}, {}
for i = 5, #ARGV, 4 do
  local ks = keys_of(ARGV[i + 3], w)
  lists[i] = ks
  for _, k in ipairs(ks) do all[#all + 1] = k end
end
fetch(all)
local d = 0
for i = 5, #ARGV, 4 do
  local s, bits = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local hb = string.sub(hs, 3 * s - 2, 3 * s)
  local mine = s == counted
  if refused[s] then  -- a retired handle's late event: nothing
  elseif ARGV[i] == 'S' then
    local e = hb .. string.char(bits)
    for _, k in ipairs(lists[i]) do
      local nv, new = hold(cur[k], hb, bits, e)
      if nv then put(k, nv) end
      if new and mine then d = d + 1 end
    end
  else
    for _, k in ipairs(lists[i]) do
      local nv, gone = unhold(cur[k], hb, bits)
      if nv ~= nil then put(k, nv) end
      if gone and mine then d = d - 1 end
    end
  end
end
flush()
return d
"""

# The sweep cycle's state, KEYS[1] = 'kvm:{ctl}:sweep' (HASH): 'id', 'tc' (the ticket
# counter when it started: its fence, ``handle_fence.py``), 'f' once every tag is fenced,
# 'nodes' (the primaries' names, space separated), per node its SCAN cursor or 'done' and
# 'L' .. node (the node's layout when its scan started: ``sweep_layout.py``), 'c' (set
# when every node was done: the confirmation a later step must see).

# KEYS[1] = the sweep state; ARGV = the names of the cluster's primaries
# Starts a cycle when none runs and some retired handle is not busy (those move from the
# dead set to the cycle set; busy ones wait for a later cycle); restarts every cursor when
# the primaries changed. Returns {} when idle, else {id, {field, value, ...}, handles}.
SWEEP_BEGIN = _CTL + r"""
local S, DEAD, CYCLE = KEYS[1], CTL .. 'dead', CTL .. 'cycle'
local id = redis.call('HGET', S, 'id')
if not id then
  if redis.call('SCARD', DEAD) == 0 then return {} end
  redis.call('ZREMRANGEBYSCORE', BUSY, '-inf', now_ms() - """ + str(BUSY_MS) + r""")
  local busy = {}
  for _, m in ipairs(redis.call('ZRANGE', BUSY, 0, -1)) do
    busy[string.match(m, '^(%d+):')] = true
  end
  for _, h in ipairs(redis.call('SMEMBERS', DEAD)) do
    if not busy[h] then redis.call('SMOVE', DEAD, CYCLE, h) end
  end
  if redis.call('SCARD', CYCLE) == 0 then return {} end
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
"""

# KEYS[1] = the sweep state; ARGV[1] = cycle id. Marks the cycle fenced (every tag's fence
# written: its scan steps may run). Returns 1, or 0 for another cycle.
SWEEP_FENCED = BASE + r"""
if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'f', '1')
return 1
"""

# KEYS[1] = the sweep state; ARGV[1] = cycle id, ARGV[2] = the 'c' the caller's
# SWEEP_BEGIN saw ('' none), then per primary: name, the cursor its SCAN started from
# ('done': not scanned), the cursor it returned ('' none), its layout around the SCAN
# ('': unstable or changed within the step)
# A node whose layout differs from the one its scan started with (or is unstable) starts
# its scan over, done or not; else its cursor moves on only from the cursor the caller
# scanned from (a compare-and-set: another replica's step may have moved or reset it).
# Once every node is done 'c' is set; a step that began after it (ARGV[2] = 'c') and found
# nothing changed completes the cycle: its handles are free again.
# Returns -1 (ignored: another cycle, or not fenced), 1 in progress, 2 complete.
SWEEP_STEP = BASE + r"""
local S = KEYS[1]
if redis.call('HGET', S, 'id') ~= ARGV[1] or redis.call('HGET', S, 'f') ~= '1' then
  return -1
end
for i = 3, #ARGV, 4 do
  local n, from, nxt, L = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local cur = redis.call('HGET', S, n)
  local seen = redis.call('HGET', S, 'L' .. n)
  if not cur then  -- not a node of this cycle
  elseif L == '' or (seen and seen ~= L) then
    redis.call('HSET', S, n, '0')
    redis.call('HDEL', S, 'L' .. n, 'c')
  elseif cur == from and nxt ~= '' then
    if from == '0' then redis.call('HSET', S, 'L' .. n, L) end
    redis.call('HSET', S, n, nxt == '0' and 'done' or nxt)
  end
end
for n in string.gmatch(redis.call('HGET', S, 'nodes') or '', '%S+') do
  if redis.call('HGET', S, n) ~= 'done' then return 1 end
end
local c = redis.call('HGET', S, 'c')
if c and c == ARGV[2] then
  redis.call('SUNIONSTORE', CTL .. 'free', CTL .. 'free', CTL .. 'cycle')
  redis.call('DEL', CTL .. 'cycle', S)
  return 2
end
if not c then
  local t = redis.call('TIME')
  redis.call('HSET', S, 'c', t[1] .. '.' .. t[2])
end
return 1
"""

# KEYS[1] = a key of the tag's slot; ARGV[1] = the cycle's handles (3 bytes each),
# ARGV[2..] = block keys of the slot (found by SCAN)
# Drops the handles' entries (a key left without one is deleted); returns how many.
TAG_CLEAN = BASE + DROP_ENTRIES + r"""
local gone = {}
for p = 1, #ARGV[1], 3 do gone[string.sub(ARGV[1], p, p + 2)] = true end
return drop_entries(ARGV, 2, #ARGV, gone)
"""
