"""Which process's data a block tag's slot holds, and what the janitor does when that changed.

Each tag's sentinel ``{T}!`` (in the slot, so it travels with the data) names the primary
(``run_id:master_replid``) that served it when last stamped. A sentinel gone or naming
another identity means the shard came back empty or older: the generation moves
(compare-and-set) before the tag is stamped again, and every worker resyncs. False
positives cost one resync, nothing else.

See docs/architecture.md#redis-cluster-details.
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
