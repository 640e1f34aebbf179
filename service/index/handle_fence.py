"""Handle fences on a multi-shard Redis Cluster: a wave that lands after the sweep freed its
handle (and the handle went to another worker) is refused, however late it comes.

The race. A service replica runs a batch's begin step (``APPLY_BEGIN`` / ``SYNC_BEGIN``,
control slot), then stalls (a GC pause, a frozen VM) for longer than the busy mark's 60 s
(``redis.lua.BUSY_MS``). Meanwhile its handle ``h`` is retired (the worker resyncs),
the sweep stops waiting for the stale busy mark, drops every entry of ``h``, frees it, and
``h`` is drawn again for another worker. Without a fence the late wave then writes ``h``'s
entries: the other worker is claimed to hold blocks it never had.

Why it cannot happen. Every begin step draws a *ticket*, ``INCR kvm:{ctl}:ticket``
(``_ticket.lua``; strictly increasing, since every begin runs on the control slot's
one primary), and its wave carries it (``TAG_WRITE``'s ARGV[4]). A sweep cycle records
the ticket counter when it starts (``tc``, in ``SWEEP_BEGIN``, the same script that takes
the cycle's handles out of the dead set); before any of its scan steps, it writes
``handle -> tc`` into every tag's fence ``{T}#`` (``cluster_tag_fence.lua``; the cycle is marked
fenced only once all 64 are written, and scan steps of an unfenced cycle are refused). A
tag step refuses, in the same script and so atomically on its slot, every event of a
handle whose fence is ``>=`` the wave's ticket. Now:

- every begin that can write a cycle's handle ran before the cycle started (a retired
  handle is no record's any more, so no later begin hands it out): its ticket is ``<= tc``,
  and once a tag's fence is written, none of its writes of that handle lands on that tag;
- a write that landed on a tag before its fence did so before the cycle's scan began,
  so the scan finds it and drops it; the handle is free only after the whole scan;
- the handle's next owner's begins all run after the cycle ended, so their tickets are
  ``> tc``: the fence never refuses them (a fence only grows: ``cluster_tag_fence.lua`` keeps the
  largest ticket). So no entry of a freed handle survives its cycle, and none is added
  later, however long the writer stalled. No clock is involved (the 60 s mark only saves
  the sweep work; it is no longer what makes the race impossible).

What a refused event costs: nothing a reader could see, it was an entry of a retired
handle. Fences move with their slot (a slot migration moves ``{T}#`` with the blocks). A
shard that comes back empty or older loses its fences with its data, but it also moves
the generation (``shard_identity.py``): every worker resyncs onto a fresh handle, so an
entry a stale writer could add there meanwhile belongs to a handle about to be retired
and swept again under a fresh fence. A lost control slot restarts the ticket counter;
its recovery deletes every fence with every block key, starts the counter at the server
time in microseconds (as a missing counter always starts) and sets every tag's floor
(field ``*``: refuses every handle) to that start, before any worker can register: every
ticket the old counter gave out lies below (a counter that started at a time in
microseconds and grows by one per begin, fewer than one per microsecond, stays below
the clock), every new one above.
"""
from __future__ import annotations

from service.index.redis import keys

__all__ = ["TICKET", "fence_key"]

TICKET = keys.CTL + "ticket"


def fence_key(tag_index: int) -> bytes:
    """The fence of the tag at ``tag_index`` (``{T}#``: in that tag's slot)."""
    return b"{" + bytes([keys.TAGS[tag_index]]) + b"}#"
