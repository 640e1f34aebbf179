"""``bridge.wire``: index events as request bytes are the messages' bytes, whatever they hold.

The bridge process's states emit ``Wire`` events; every other test of the engine state reads
messages. These tie the two: the same batches give byte-identical ``PublishEvents`` requests.
"""
from __future__ import annotations

import os

import pytest

from bench.bridge.ingest import payloads
from bridge.engine_state import EngineState
from bridge.pending import Pending
from bridge.wire import Wire, varint
from kvmesh.link.request import publish_head, publish_request
from kvmesh.v1 import index_pb2 as pb


@pytest.mark.parametrize("n", [0, 1, 3, 1024])
@pytest.mark.parametrize("size", [16, 32, 200])
@pytest.mark.parametrize("seq", [0, 1, 127, 128, 300, 2**40])
def test_events_serialize_as_protobuf_does(n: int, size: int, seq: int) -> None:
    hashes = [os.urandom(size) for _ in range(n)]
    if n > 1:
        hashes[1] = hashes[1][:-1]  # one of another length
    for tier in (0, pb.TIER_GPU, pb.TIER_DISK):
        for parent in (b"", os.urandom(32)):
            msg = pb.KvEvent(seq=seq, stored={"block_hashes": hashes, "parent_hash": parent,
                                              "tier": tier})
            assert Wire.stored(seq, hashes, parent, tier).event == msg.SerializeToString()
        msg = pb.KvEvent(seq=seq, removed={"block_hashes": hashes, "tier": tier})
        assert Wire.removed(seq, hashes, tier).event == msg.SerializeToString()
    msg = pb.KvEvent(seq=seq, cleared=pb.AllBlocksCleared())
    assert Wire.cleared(seq).event == msg.SerializeToString()


def test_varint() -> None:
    for n in (0, 1, 127, 128, 255, 300, 16383, 16384, 2**63):
        assert pb.KvEvent(seq=n).SerializeToString() == (b"\x08" + varint(n) if n else b"")


def test_a_wire_state_publishes_the_bytes_a_message_state_does() -> None:
    work = payloads(60, engines=2, blocks=5, block_size=4, window=3)
    plain = [EngineState(block_size=4) for _ in range(2)]
    wire = [EngineState(block_size=4, wire=True) for _ in range(2)]
    head = publish_head("e", 7)
    pending, reference = Pending(), Pending()
    for k, (i, seq, payload) in enumerate(work):
        a, b = plain[i].ingest(seq, payload), wire[i].ingest(seq, payload)
        if k == 30:  # a clear and the batch after it
            a, b = a + plain[i].clear(), b + wire[i].clear()
        assert all(type(ev) is Wire for ev in b) and len(a) == len(b)
        assert publish_request(head, b) == publish_request(head, a)
        assert pb.PublishEventsRequest.FromString(publish_request(head, b)).events == a
        if i == 0:  # weighed as the messages are
            assert pending.add(b) and reference.add(a)
    assert pending.blocks == reference.blocks > len(pending) > 0
    assert [ev.seq for ev in pending.batch(5, 12)] == [ev.seq for ev in reference.batch(5, 12)]
