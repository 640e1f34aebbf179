-- Which server process's data a tag's slot holds (shard_identity.py).
-- KEYS[1] = the tag's sentinel '{T}!'
-- ARGV[1] = '' (check), an identity (stamp it if it still serves the slot) or '*' (stamp
-- whatever identity serves it)
-- Returns, checking: '' when the sentinel names the identity serving the slot, else that
-- identity; stamping: 1 stamped, 0 not (another identity serves the slot now).


local info = redis.call('INFO', 'server', 'replication')
local id = string.match(info, 'run_id:(%x+)') .. ':' .. string.match(info, 'master_replid:(%x+)')
if ARGV[1] == '' then
  if redis.call('GET', KEYS[1]) == id then return '' end
  return id
end
if ARGV[1] ~= '*' and ARGV[1] ~= id then return 0 end
redis.call('SET', KEYS[1], id)
return 1
