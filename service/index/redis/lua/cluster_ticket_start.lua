-- Start the ticket counter when missing (the recovery's: handle_fence.py).
-- KEYS[1] = the ticket counter 'kvm:{ctl}:ticket'
-- ARGV: none
-- Returns the counter's value.

local CTL = '${CTL}'
--@include ticket

if redis.call('EXISTS', TICKET) == 0 then ticket() end
return redis.call('GET', TICKET)
