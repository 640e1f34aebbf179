"""Pool -> index: a worker pool's events and snapshots as ``IndexService`` messages.

The one converter between ``kvmesh.events.pool`` and ``index_pb2`` (the worker's service link
publishes what it gives). Pure conversions (no I/O), torch-free. An event keeps its ``seq``;
a chain's first block has parent ``b""``; a removal lists each hash once, as the pool does.
``kvmesh.events.wire`` writes the same messages' bytes directly. A snapshot is sent as runs
of chained blocks, each run one ``index_pb2.BlockStored`` of one tier whose ``parent_hash``
is the parent of its first block, so the index can rebuild every (hash, parent, tier) from
far fewer messages.
"""
from __future__ import annotations

from kvmesh.contract import TIER_PB
from kvmesh.events.pool import CacheSnapshot, PoolCleared, PoolEvent, PoolRemoved, PoolStored
from kvmesh.v1 import index_pb2

TIERS = TIER_PB


def event_to_proto(ev: PoolEvent) -> index_pb2.KvEvent:
    """One pool event as the message ``PublishEvents`` carries (its ``seq`` kept)."""
    if isinstance(ev, PoolStored):
        return index_pb2.KvEvent(seq=ev.seq, stored=index_pb2.BlockStored(
            block_hashes=ev.block_hashes, parent_hash=ev.parent_hash or b"",
            tier=TIERS[ev.tier]))
    if isinstance(ev, PoolRemoved):
        return index_pb2.KvEvent(seq=ev.seq, removed=index_pb2.BlockRemoved(
            block_hashes=ev.block_hashes, tier=TIERS[ev.tier]))
    assert isinstance(ev, PoolCleared)
    return index_pb2.KvEvent(seq=ev.seq, cleared=index_pb2.AllBlocksCleared())


def snapshot_chains(hashes: list[bytes], parents: list[bytes | None],
                    tier: int) -> list[index_pb2.BlockStored]:
    """Group a snapshot's (hash, parent) pairs into runs of consecutive chain blocks."""
    out: list[index_pb2.BlockStored] = []
    run: list[bytes] = []
    for h, parent in zip(hashes, parents, strict=True):
        if run and parent == run[-1]:
            run.append(h)
            continue
        if run:
            out[-1].block_hashes.extend(run)
        out.append(index_pb2.BlockStored(parent_hash=parent or b"", tier=tier))
        run = [h]
    if run:
        out[-1].block_hashes.extend(run)
    return out


def snapshot_blocks(snap: CacheSnapshot) -> list[index_pb2.BlockStored]:
    """A whole snapshot as runs, tier after tier (a hash on two tiers is in a run of each).
    Lower tiers list their blocks in LRU order, where a chain's tail comes first: their
    parents are put before their children so chains form long runs. The device tier is
    sent in its own order, as it always was."""
    out: list[index_pb2.BlockStored] = []
    for tier, (hashes, parents) in snap.by_tier().items():
        if tier != snap.tier:
            order = chain_order(hashes, parents)
            hashes, parents = [hashes[i] for i in order], [parents[i] for i in order]
        out += snapshot_chains(hashes, parents, TIERS[tier])
    return out


def chain_order(hashes: list[bytes], parents: list[bytes | None]) -> list[int]:
    """Indexes of ``hashes`` ordered so each block follows its parent (depth first, so a
    chain is contiguous); blocks whose parent is absent start a chain, in their order.
    Every index appears exactly once (a cycle, impossible without a hash collision, is
    appended as it comes)."""
    index = {h: i for i, h in enumerate(hashes)}
    children: dict[int, list[int]] = {}
    roots: list[int] = []
    for i, parent in enumerate(parents):
        p = index.get(parent) if parent is not None else None
        if p is None or p == i:
            roots.append(i)
        else:
            children.setdefault(p, []).append(i)
    out: list[int] = []
    stack = roots[::-1]
    while stack:
        i = stack.pop()
        out.append(i)
        stack.extend(reversed(children.get(i, ())))
    if len(out) < len(hashes):
        seen = set(out)
        out += [i for i in range(len(hashes)) if i not in seen]
    return out
