"""The link's cheaper paths keep their contracts: a ``PublishEvents`` request serialized by
the link (``publish_request``) is the request the generated stub would have sent, and the
bridge's collector tuning (``quiet_gc``) is undone on the way out."""
from __future__ import annotations

import gc

import pytest

from bridge.main import quiet_gc
from kvmesh.link.request import publish_head, publish_request
from kvmesh.v1 import index_pb2 as pb


def stored(seq: int, n: int, tier: int = pb.TIER_GPU) -> pb.KvEvent:
    return pb.KvEvent(seq=seq, stored={"block_hashes": [(seq * 7919 + i).to_bytes(32, "big")
                                                        for i in range(n)],
                                       "parent_hash": b"" if seq % 2 else b"p" * 32,
                                       "tier": tier})


@pytest.mark.parametrize("worker_id,incarnation", [("e0", 1), ("bench-e7", 2**64 - 1),
                                                   ("", 0)])
def test_a_serialized_request_parses_to_the_message_the_stub_would_send(
        worker_id: str, incarnation: int) -> None:
    # event sizes around the varint steps of their length (1, 2 and 3 bytes)
    events = [stored(1, 0), stored(2, 1), stored(3, 3), stored(4, 4), stored(5, 480),
              stored(6, 1024, pb.TIER_DISK),
              pb.KvEvent(seq=7, removed={"block_hashes": [b"r" * 32] * 5,
                                         "tier": pb.TIER_CPU}),
              pb.KvEvent(seq=8, cleared=pb.AllBlocksCleared()), stored(2**40, 16)]
    want = pb.PublishEventsRequest(worker_id=worker_id, events=events,
                                   incarnation=incarnation)
    raw = publish_request(publish_head(worker_id, incarnation), events)
    assert pb.PublishEventsRequest.FromString(raw) == want
    assert len(raw) == want.ByteSize()
    for i in range(len(events)):  # any prefix, as the link's batches are
        assert pb.PublishEventsRequest.FromString(
            publish_request(publish_head(worker_id, incarnation), events[:i])) == \
            pb.PublishEventsRequest(worker_id=worker_id, events=events[:i],
                                    incarnation=incarnation)


@pytest.mark.slow
def test_the_collector_is_tuned_while_serving_and_restored_after() -> None:
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    with quiet_gc(young=12_345):
        assert gc.get_threshold()[0] == 12_345
        assert gc.get_freeze_count() > frozen
        assert gc.isenabled()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == frozen


def test_the_collector_is_restored_when_serving_fails() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), quiet_gc():
        raise RuntimeError("the bridge crashed")
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
