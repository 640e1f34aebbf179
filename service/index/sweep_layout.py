"""What a primary holds, as the cluster sweep needs it: why a slot that migrates while a
sweep cycle runs cannot make the sweep miss its keys.

The race. The sweep (``cluster_upkeep.Upkeep.sweep``) ``SCAN``s every primary; a cycle's
handles are free once every primary's scan came back to 0. ``SCAN`` returns every key
that stays on the node for the whole scan, but not a key that arrives meanwhile: a block
key of a slot migrating from A (not yet scanned there) to B (already scanned past it)
would be visited by neither, keep its entry of a retired handle, and lend it to the
handle's next owner.

Why it cannot happen. A node's *layout* (:func:`layout`) is the set of block tags whose
slots it serves in its own view (``CLUSTER NODES``, its ``myself`` line), or ``''``
(*unstable*) while any slot is migrating or importing there. Each sweep step sends every
primary ``CLUSTER NODES``, its ``SCAN`` (nodes not done), ``CLUSTER NODES`` again, in one
write (a node runs them in order), so each scan call is bracketed by two samples; a step
whose two samples differ counts as unstable. ``SWEEP_STEP`` records a node's layout when
its scan starts and starts the scan over (done or not) when a later sample differs or is
unstable. A key moves into a node only by a migration, which shows the node importing
while it runs and another layout once it is done: so a key that arrived on a node during
its scan is seen by some sample of that node after it arrived, and that scan starts over.
The cycle completes only in a step that began after every node was done (``c``, set by
the step that made them all done, after their last scans replied) and found every layout
unchanged: any key that moved during any node's scan has by then changed a layout that
this step sampled. So every block key that existed when the cycle was fenced is visited
by a complete scan of the node that holds it; keys migrated mid-cycle are visited after
the move (cleaning is idempotent: a key visited twice is cleaned twice).

What it does not cover: a migration aborted by hand after moving keys (``SETSLOT STABLE``
on both sides) leaves keys on a node that does not serve their slot; no reader reaches
them, and a later migration there shows as a layout change.
"""
from __future__ import annotations

__all__ = ["layout", "step_layout"]


def _ranges(fields: list[bytes]) -> tuple[list[tuple[int, int]], bool]:
    """The slot ranges of a ``CLUSTER NODES`` line's slot fields, and whether any slot is
    migrating or importing (``[slot->-id]`` / ``[slot-<-id]``)."""
    out: list[tuple[int, int]] = []
    moving = False
    for f in fields:
        if f.startswith(b"["):
            moving = True
            continue
        a, _, z = f.partition(b"-")
        out.append((int(a), int(z or a)))
    return out, moving


def layout(nodes_reply: bytes | str, tag_slots: list[int]) -> str:
    """The layout of the node that answered ``CLUSTER NODES`` with ``nodes_reply``: the
    indices of ``tag_slots`` it serves, comma separated ('-' for none), or ``''`` while a
    slot migrates or imports there (see the module docstring)."""
    text = nodes_reply.encode() if isinstance(nodes_reply, str) else nodes_reply
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 8 and b"myself" in parts[2].split(b","):
            ranges, moving = _ranges(parts[8:])
            if moving:
                return ""
            mine = [str(i) for i, s in enumerate(tag_slots)
                    if any(a <= s <= z for a, z in ranges)]
            return ",".join(mine) or "-"
    return ""


def step_layout(before: bytes | str, after: bytes | str, tag_slots: list[int]) -> str:
    """The layout of a sweep step's node from its two samples: ``''`` when they differ."""
    a, z = layout(before, tag_slots), layout(after, tag_slots)
    return a if a == z else ""
