-- Fragment: the control slot's helpers on a Redis Cluster (_base, _handles, _lane, _ticket,
-- GEN): the scripts of the control slot (register, heartbeat, handles, sweeps) start with it.
-- KEYS, ARGV: none of its own (those of the script that includes it).

--@include base
--@include handles
--@include lane

local GEN = CTL .. 'gen'

--@include ticket
