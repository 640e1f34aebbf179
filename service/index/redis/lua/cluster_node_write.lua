-- A wave's part on one node: hold and unhold entries of the node's keys, in event order
-- (node_waves.py: one call per node, or per tag after a slot moved). A wave may carry the
-- batches of several workers (group_commit.py): each batch has its handle and ticket.
-- KEYS[1] = a key of one of the node's slots (it routes the call)
-- ARGV[1] = KW (bytes of one block key), ARGV[2] = the wave's handles (3 bytes each, one
-- per batch: a handle may come twice), ARGV[3] = their tickets (each batch's, drawn with
-- its handle: the lane's `tk`; comma-separated, in the same order), ARGV[4..] = the node's part of each event, batch
-- after batch, each batch in event order: 'S' (hold) or 'R' (unhold), batch index (1-based),
-- tier bits, keys (concatenated; of any tags the node serves)
-- One command per key, all reads before any write (_held_events). The events of a batch
-- whose handle is fenced on a key's tag at or above its ticket are refused there
-- (handle_fence.py).
-- Returns per batch, in order, the entries of its handle it added minus those it removed.

--@include base
--@include values

local w, hs, tickets = tonumber(ARGV[1]), ARGV[2], {}
for t in string.gmatch(ARGV[3], '[^,]+') do tickets[#tickets + 1] = tonumber(t) end
--@include held_events

return apply_held(4)
