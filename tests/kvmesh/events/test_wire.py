"""``kvmesh.events.wire``: index events as request bytes are the messages' bytes, whatever
they hold (the hand-encoded form beside the protobuf one it must equal).
"""
from __future__ import annotations

import os

import pytest

from kvmesh.events.wire import Wire, varint
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
