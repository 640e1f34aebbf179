"""Handle fences on a multi-shard Redis Cluster: a wave that lands after the sweep freed its
handle (and the handle went to another worker) is refused, however late it comes.

Every handle is drawn with a ticket (``cluster_handle``, ``cluster_register``) and every
batch written with that handle carries it (the worker's lane holds both: ``lanes.py``); a
sweep cycle fences its handles on every tag with the ticket counter at its start before it
scans, and a tag step refuses events of a handle fenced at or above its ticket. No clock is
involved, so no stall, however long, lets a freed handle's entry land.

See docs/architecture.md#redis-cluster-details.
"""
from __future__ import annotations

from service.index.redis import keys

__all__ = ["TICKET", "fence_key"]

TICKET = keys.CTL + "ticket"


def fence_key(tag_index: int) -> bytes:
    """The prefix of the fences of the tag at ``tag_index`` (``{T}#``, in that tag's slot:
    ``{T}#`` + a 3-byte handle, ``{T}#*`` the floor; STRINGs, so a write step reads them with
    the tag's block keys in one ``MGET``)."""
    return b"{" + bytes([keys.TAGS[tag_index]]) + b"}#"
