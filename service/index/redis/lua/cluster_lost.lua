-- Move the block shards' generation (every worker then resyncs: shard_identity.py).
-- KEYS[1] = 'kvm:{ctl}:gen'
-- ARGV[1] = the generation the caller read after it saw a tag's sentinel gone or another
-- identity serving it
-- Moves the generation unless another replica moved it since; returns the current one, or
-- false when there is none (the control slot was lost: recovery, not this).

--@include base

local g = redis.call('GET', KEYS[1])
if g and g == ARGV[1] then
  local t = redis.call('TIME')
  g = t[1] .. '.' .. t[2]
  redis.call('SET', KEYS[1], g)
end
return g
