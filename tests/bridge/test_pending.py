"""The link's pending index events: bounded, leaving by seq, batched under both limits."""
from __future__ import annotations

from bridge.pending import Pending, hashes_of
from kvmesh.link.backlog import BatchLimits
from kvmesh.v1 import index_pb2 as pb


def ev(seq: int, n: int) -> pb.KvEvent:
    return pb.KvEvent(seq=seq, stored=pb.BlockStored(block_hashes=[bytes([i]) for i in range(n)]))


def test_batches_respect_both_limits_but_never_split_an_event() -> None:
    p = Pending(100)
    assert p.add([ev(1, 3), ev(2, 3), ev(3, 10), ev(4, 0)])
    assert [e.seq for e in p.batch(10, 6)] == [1, 2]
    assert [e.seq for e in p.batch(1, 100)] == [1]
    p.drop_through(2)
    assert [e.seq for e in p.batch(10, 4)] == [3]  # alone over the limit: still sent
    assert p.blocks == 11 + 1


def test_overflow_drops_everything_and_says_so() -> None:
    p = Pending(10)
    assert p.add([ev(1, 4)], after=0) and not p.add([ev(2, 5)])
    assert len(p) == 0 and p.blocks == 0
    assert p.add([ev(3, 1), ev(4, 1)], after=3) and [e.seq for e in p.batch(9, 9)] == [4]


def test_a_refused_batch_halves_the_limits_until_registration_resets_them() -> None:
    limits = BatchLimits(512, 8192)
    assert limits.halve([ev(1, 3), ev(2, 5), ev(3, 0)], hashes_of)
    assert (limits.events, limits.hashes) == (1, 4)
    assert not limits.halve([ev(4, 9)], hashes_of)  # one event: nothing smaller to try
    assert (limits.events, limits.hashes) == (1, 4)
    limits.reset()
    assert (limits.events, limits.hashes) == (512, 8192)
