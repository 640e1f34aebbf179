-- A wave's part on one node: hold and unhold entries of the node's keys, in event order
-- (node_waves.py: one call per node, or per tag after a slot moved).
-- KEYS[1] = a key of one of the node's slots (it routes the call)
-- ARGV[1] = KW (bytes of one block key), ARGV[2] = the batch's handles (3 bytes each),
-- ARGV[3] = the handle (1-based index) whose entry count is returned, ARGV[4] = the
-- batch's ticket (its begin step's), ARGV[5..] = the node's part of each event, in event
-- order: 'S' (hold) or 'R' (unhold), handle index, tier bits, keys (concatenated; of any
-- tags the node serves)
-- One command per key, all reads before any write (_held_events). The events of a handle
-- fenced on a key's tag at or above the ticket are refused there (handle_fence.py).
-- Returns the entries of handle ARGV[3] added minus removed.

--@include base
--@include values

local w, hs, counted, ticket = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
--@include held_events

return apply_held(5)
