"""Which process's data a block tag's slot holds, and what the janitor does when that
changed: a shard that came back EMPTY or OLDER (a replica promoted after its primary lost
the last writes, a restart from an RDB or AOF a second old) moves the generation, so every
worker resyncs (``cluster_heartbeat.lua``: a record whose ``g`` differs is asked for a snapshot).

The identity of a primary is ``run_id:master_replid`` (``INFO server`` / ``INFO
replication``). ``run_id`` is new at every start of a server process, so a restart, from
whatever file, changes it; a different node serving the slot (a failover, a slot moved)
has another ``run_id``; ``master_replid`` is new whenever a replica is promoted, so a node
that was a replica meanwhile (failed over, then failed back within a check) changes too.
Each tag's sentinel ``{T}!`` holds the identity of the primary that served the tag's slot
when the janitor last stamped it. The sentinel lives IN the slot, so it is persisted,
replicated, restored and migrated WITH the data it vouches for: a shard back from an old
dump holds the old sentinel, and a replica holds its primary's; both differ from the
identity now serving. A tag whose sentinel is gone (back empty) or names another
identity is *changed*.

Contract (:func:`check`, every service replica's janitor, every second: one parallel round
trip, 64 read-only scripts, when nothing changed):

- ``cluster_tag_identity.lua`` runs in the tag's slot and reads ``INFO`` in the same script, so the
  identity is that of the primary serving the slot at that instant (a node that does not
  serve it answers ``MOVED``), compared with the sentinel beside it, atomically. A slot
  whose keys are migrating right now (``ASK`` / ``TRYAGAIN``) is checked once moved.
- On a change: the generation is read again (after the change was seen), then moved by
  ``LOST`` from that value (compare-and-set: of several replicas that saw the change, one
  moves it; a replica whose value is already old finds it moved, and any move after its
  read came after the change). Only then are the changed tags stamped, each only if the
  identity serving it is still the one the check saw (a second restart in between is left
  for the next check). So no change is ever stamped without a move of the generation
  after it, and every worker snapshot that counts was written after the change.
- Until the workers' snapshots land (a heartbeat, about a second, plus the snapshot),
  lookups may see the older entries; after, none: the snapshots' fresh handles replace
  every old entry (readers count live handles only).

False positives cost one resync of every worker, nothing else: a clean restart that lost
nothing (AOF ``always``), a planned failover, a slot migrated to another primary, and the
first check after an upgrade (sentinels then held ``1``). A ``DEBUG RELOAD`` or a manual
``RESTORE`` of older values into the same running process is not seen (no identity
changed); neither happens to a primary by itself.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import redis.exceptions as rexc

from service.index import nodes
from service.index.redis import keys, lua, resp

if TYPE_CHECKING:
    from service.index.cluster import ClusterBackend

__all__ = ["SENTINELS", "check", "stamp_all"]

log = logging.getLogger(__name__)

SENTINELS = [b"{" + bytes([t]) + b"}!" for t in keys.TAGS]  # by tag index
GEN = keys.CTL + "gen"
_MIGRATING = (rexc.AskError, rexc.TryAgainError)  # the slot's keys are moving right now
TAG_IDENTITY = lua.raw("cluster_tag_identity")

async def check(b: ClusterBackend) -> bool:
    """The janitor's check (module contract): False when the control slot has no
    generation (the caller recovers), else True (the generation moved if a tag changed)."""
    from service.index.cluster import CTL_SLOT, TAG_SLOTS

    batch = [(CTL_SLOT, resp.command(b"GET", GEN.encode()))] + [
        (TAG_SLOTS[i], TAG_IDENTITY.call(s, [b""])) for i, s in enumerate(SENTINELS)]
    res = await nodes.on_slots(b.client, batch, retry=True)
    if any(isinstance(r, rexc.NoScriptError) for r in res):
        res = await b.wave(batch, retry=True)  # loads the scripts; a migrating slot raises
    for r in res:
        if isinstance(r, Exception) and not isinstance(r, _MIGRATING):
            raise r
    if res[0] is None:
        return False
    # a slot migrating now is checked once it has moved (the sentinel moves with it)
    changed = {i: r for i, r in enumerate(res[1:]) if r and not isinstance(r, _MIGRATING)}
    if not changed:
        return True
    gen = await b.client.get(GEN)  # read after the change was seen: see the contract
    if gen is None or await b._lost([GEN], [gen]) is None:
        return False
    await b.wave([(TAG_SLOTS[i], TAG_IDENTITY.call(SENTINELS[i], [ident]))
                  for i, ident in changed.items()])
    log.warning("index: %d of %d block tags came back empty or from another server process "
                "(a restart, a failover: data may be older): every worker resyncs",
                len(changed), len(SENTINELS))
    return True


async def stamp_all(b: ClusterBackend) -> None:
    """Every sentinel stamped with the identity serving its slot (the recovery's start)."""
    from service.index.cluster import TAG_SLOTS

    await b.wave([(TAG_SLOTS[i], TAG_IDENTITY.call(s, [b"*"])) for i, s in enumerate(SENTINELS)])
