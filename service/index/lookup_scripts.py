"""The redis backend's lookup and provisional scripts (layout: ``keys.py``; the shared
Lua helpers ``BASE``: ``scripts.py``)."""
from __future__ import annotations

from service.index.scripts import BASE

# KEYS[1] = the namespace's live handles 'kvm:{ctl}:live:<ns>' (handle -> worker id),
# KEYS[2] = its provisional marker 'kvm:{ctl}:pm:<ns>' (lookups skip 'p' keys without it)
# ARGV[1] = now ms, ARGV[2] = W (bytes of a hash), ARGV[3] = the chain's block hashes from
# block 0 (raw, concatenated), ARGV[4] = ns, ARGV[5] = k, the number of allowed workers
# (-1: any), ARGV[6 .. 5+k] = their ids
# Block 0's holders start the candidate set: its live handles (resolved to worker ids
# through KEYS[1]) and its unexpired provisional holders; later blocks only test the
# candidates left (a find of the candidate's 3-byte handle per block value, or of
# ';<id>|' in the provisional value). A block whose values equal the previous block's
# (sorted entries: equal holder sets give equal strings) only extends a run, credited at
# the end. Keys are read in growing chunks (MGET of 32, 64, ... keys) and the walk stops
# as soon as the last candidate dropped out.
# Returns {worker, blocks, gpu, cpu, disk, ...} for each worker matching >= 1 block.
LOOKUP = BASE + r"""
local now, w, hs, ns = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]
local k, n = tonumber(ARGV[5]), #ARGV[3] / tonumber(ARGV[2])
local allowed = nil
if k >= 0 then
  allowed = {}
  for i = 6, 5 + k do allowed[ARGV[i]] = true end
end
local has_prov = redis.call('EXISTS', KEYS[2]) == 1
local active, n_active, out = {}, 0, {}
local function tally(c, m, times)
  c[1] = c[1] + times
  if bit.band(m, 1) ~= 0 then c[2] = c[2] + times
  elseif bit.band(m, 2) ~= 0 then c[3] = c[3] + times
  else c[4] = c[4] + times end
  c.m = m
end
local function join(wid, hb, m)  -- a candidate from block 0 (hb false: no live handle)
  active[wid] = {0, 0, 0, 0, hb = hb, np = ';' .. wid .. '|'}
  tally(active[wid], m, 1)
  n_active = n_active + 1
end
local function start(v, pv)  -- block 0's holders
  if v then
    local hs0 = {}
    for p = 1, #v, EB do hs0[#hs0 + 1] = tostring(hnum(v, p)) end
    for a = 1, #hs0, 1000 do
      local b = math.min(#hs0, a + 999)
      local wids = redis.call('HMGET', KEYS[1], unpack(hs0, a, b))
      for e = a, b do
        local wid = wids[e - a + 1]
        if wid and (allowed == nil or allowed[wid]) then
          local p = (e - 1) * EB + 1
          join(wid, string.sub(v, p, p + 2), string.byte(v, p + 3))
        end
      end
    end
  end
  if pv then
    for wid, exp in string.gmatch(pv, ';([^|;]+)|(%d+)') do
      if tonumber(exp) > now and not active[wid] and (allowed == nil or allowed[wid]) then
        local h = redis.call('HGET', CTL .. 'w:' .. ns .. '|' .. wid, 'h')
        join(wid, h and hbytes(tonumber(h)), 1)
      end
    end
  end
end
local function emit(wid, c)
  out[#out + 1] = wid
  for t = 1, 4 do out[#out + 1] = c[t] end
end
local prev_v, prev_pv, run = {}, {}, 0  -- tables never equal a value
local function flush()  -- credit `run` more blocks to every candidate, at its last mask
  if run == 0 then return end
  for _, c in pairs(active) do tally(c, c.m, run) end
  run = 0
end
local i, chunk = 0, 32
while i < n do
  local last = math.min(n, i + chunk)
  local bkeys, pkeys = {}, {}
  for j = i, last - 1 do
    local key = bkey(string.sub(hs, j * w + 1, (j + 1) * w))
    bkeys[#bkeys + 1] = key
    if has_prov then pkeys[#pkeys + 1] = 'p' .. key .. ns end
  end
  local vals = redis.call('MGET', unpack(bkeys))
  local pvals = {}
  if has_prov then pvals = redis.call('MGET', unpack(pkeys)) end
  local j0 = 1
  if i == 0 then
    start(vals[1], pvals[1])
    if n_active == 0 then return out end
    j0 = 2
  end
  for j = j0, #bkeys do
    local v, pv = vals[j], pvals[j]
    if v == prev_v and pv == prev_pv then
      run = run + 1  -- same holder strings as the block before: same masks, count later
    else
      flush()
      prev_v, prev_pv = v, pv
      for wid, c in pairs(active) do
        local m = 0
        if v and c.hb then
          local p = find(v, c.hb)
          if p then m = string.byte(v, p + 3) end
        end
        if m == 0 and pv then
          local pos = string.find(pv, c.np, 1, true)
          if pos then
            local s = pos + #c.np
            local e = string.find(pv, ';', s, true)
            if tonumber(string.sub(pv, s, (e or 0) - 1)) > now then m = 1 end
          end
        end
        if m > 0 then
          tally(c, m, 1)
        else
          emit(wid, c)
          active[wid] = nil
          n_active = n_active - 1
        end
      end
    end
    if n_active == 0 then return out end
  end
  i = last
  chunk = math.min(chunk * 2, 2048)
end
flush()
for wid, c in pairs(active) do emit(wid, c) end
return out
"""

# KEYS[1] = the namespace's provisional marker 'kvm:{ctl}:pm:<ns>'
# ARGV[1] = ns, ARGV[2] = worker id, ARGV[3] = its expiry ms, ARGV[4] = now ms,
# ARGV[5] = key TTL ms, ARGV[6] = W (bytes of a hash), ARGV[7] = the block hashes the worker
# provisionally holds (raw, concatenated)
# Each 'p{T}<hash><ns>' STRING = ';worker|expiry_ms;...': the worker's entry is set/renewed,
# other unexpired holders kept, expired ones dropped; the key gets the TTL, and so does the
# namespace's marker.
PROVISIONAL = BASE + r"""
local ns, wid, now, w, hs = ARGV[1], ARGV[2], tonumber(ARGV[4]), tonumber(ARGV[6]), ARGV[7]
for a = 1, #hs, w do
  local pk = 'p' .. bkey(string.sub(hs, a, a + w - 1)) .. ns
  local v = ';' .. wid .. '|' .. ARGV[3]
  local old = redis.call('GET', pk)
  if old then
    for other, exp in string.gmatch(old, ';([^|;]+)|(%d+)') do
      if other ~= wid and tonumber(exp) > now then v = v .. ';' .. other .. '|' .. exp end
    end
  end
  redis.call('SET', pk, v, 'PX', ARGV[5])
end
redis.call('SET', KEYS[1], '1', 'PX', ARGV[5])
return 0
"""
