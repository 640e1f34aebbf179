"""``kvmesh.events.to_index``: pool events and snapshots as the index's protobuf messages."""
from __future__ import annotations

import os

import pytest

from kvmesh.events.pool import CacheSnapshot, PoolCleared, PoolRemoved, PoolStored
from kvmesh.events.to_index import TIERS, chain_order, event_to_proto, snapshot_blocks
from kvmesh.events.wire import Wire
from kvmesh.v1 import index_pb2


@pytest.mark.parametrize("seq", [1, 2, 127, 128, 2**33])
@pytest.mark.parametrize("n", [1, 3, 200])
@pytest.mark.parametrize("tier", ["gpu", "cpu", "disk"])
def test_pool_events_are_the_messages_the_wire_form_writes(seq: int, n: int, tier: str) -> None:
    """Both ways to the index (message, hand-encoded bytes) give the same bytes."""
    hashes = [os.urandom(32) for _ in range(n)]
    for parent in (None, os.urandom(32)):
        msg = event_to_proto(PoolStored(seq, hashes, parent, list(range(4 * n)), tier))
        assert msg.seq == seq and msg.stored.tier == TIERS[tier]
        assert msg.SerializeToString() == Wire.stored(seq, hashes, parent or b"",
                                                      TIERS[tier]).event
    msg = event_to_proto(PoolRemoved(seq, hashes, tier))
    assert msg.SerializeToString() == Wire.removed(seq, hashes, TIERS[tier]).event
    assert event_to_proto(PoolCleared(seq)).SerializeToString() == Wire.cleared(seq).event


def test_a_snapshot_is_runs_of_chains_per_tier() -> None:
    a, b, c, x = b"a" * 32, b"b" * 32, b"c" * 32, b"x" * 32
    snap = CacheSnapshot(9, "gpu", [a, b, x, c, b], [None, a, None, b, a],
                         ["gpu", "gpu", "gpu", "cpu", "cpu"])  # cpu in LRU order: tail first
    blocks = snapshot_blocks(snap)
    assert [(b.tier, list(b.block_hashes), b.parent_hash) for b in blocks] == [
        (index_pb2.TIER_GPU, [a, b], b""), (index_pb2.TIER_GPU, [x], b""),
        (index_pb2.TIER_CPU, [b, c], a)]


def test_chain_order_puts_parents_first_and_keeps_everything():
    hashes = [b"c", b"x", b"b", b"a", b"y"]
    parents = [b"b", b"q", b"a", None, b"x"]
    order = chain_order(hashes, parents)
    assert [hashes[i] for i in order] == [b"x", b"y", b"a", b"b", b"c"]
    cycle = chain_order([b"p", b"q"], [b"q", b"p"])  # impossible without a collision
    assert sorted(cycle) == [0, 1]
