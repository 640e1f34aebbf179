"""What a primary holds, as the cluster sweep needs it: why a slot that migrates while a
sweep cycle runs cannot make the sweep miss its keys.

A node's *layout* is the set of block tags its slots serve, or ``''`` while a slot migrates
there. Each scan call is bracketed by two samples; a changed layout restarts that node's
scan, and a cycle completes only in a step that found every layout unchanged, so every block
key is visited by a complete scan of the node holding it.

See docs/architecture.md#redis-cluster-details.
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
