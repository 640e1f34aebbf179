-- Fragment: ticket(), the control slot's ticket counter (needs CTL before it).
-- KEYS, ARGV: none of its own (those of the script that includes it).
-- A missing counter starts at the server time in microseconds, then one per handle drawn
-- (cluster_handle, cluster_register; handle_fence.py).

local TICKET = CTL .. 'ticket'
local function ticket()
  if redis.call('EXISTS', TICKET) == 0 then
    local t = redis.call('TIME')
    redis.call('SET', TICKET, t[1] .. string.format('%06d', tonumber(t[2])))
  end
  return redis.call('INCR', TICKET)
end
