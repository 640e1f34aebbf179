"""The bridge's wire states: the same batches give byte-identical ``PublishEvents`` requests.

The bridge process's states emit ``kvmesh.events.wire.Wire`` events; every other test of the
engine state reads messages. This ties the two.
"""
from __future__ import annotations

from bench.bridge.ingest import payloads
from bridge.engine_state import EngineState
from bridge.pending import Pending
from kvmesh.events.wire import Wire
from kvmesh.link.request import publish_head, publish_request
from kvmesh.v1 import index_pb2 as pb


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
