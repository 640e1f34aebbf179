"""The service link's wire form: KV events and cache snapshots as ``IndexService`` messages.

Pure conversions (no I/O). A snapshot is sent as runs of chained blocks, each run one
``BlockStored`` whose ``parent_hash`` is the parent of its first block, so the index can
rebuild every (hash, parent) pair from far fewer messages.
"""
from __future__ import annotations

from kvmesh.v1 import index_pb2
from worker.kv_cache import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

TIERS = {"gpu": index_pb2.TIER_GPU, "cpu": index_pb2.TIER_CPU}


def event_to_proto(ev: KVEvent) -> index_pb2.KvEvent:
    """One pool event as the message ``PublishEvents`` carries (its ``seq`` kept)."""
    if isinstance(ev, BlockStored):
        return index_pb2.KvEvent(seq=ev.seq, stored=index_pb2.BlockStored(
            block_hashes=ev.block_hashes, parent_hash=ev.parent_hash or b"",
            tier=TIERS[ev.tier]))
    if isinstance(ev, BlockRemoved):
        return index_pb2.KvEvent(seq=ev.seq, removed=index_pb2.BlockRemoved(
            block_hashes=ev.block_hashes, tier=TIERS[ev.tier]))
    assert isinstance(ev, AllBlocksCleared)
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
