"""Index events already in ``PublishEventsRequest``'s wire form: the link's fast path.

A ``Wire`` is one ``index_pb2.KvEvent`` as the entry of a request's repeated ``events`` field
(key, length, the event's bytes), built straight from its fields: byte for byte what
``SerializeToString`` of the same message gives (fields in number order, packed nothing;
``tests/kvmesh/events/test_wire.py`` holds it to that), framed as a request frames a
message. The link queues and sends it as it is: no message object per event, no
serialization per publish.
"""
from __future__ import annotations

from collections.abc import Sequence

from kvmesh.v1 import index_pb2

_EVENTS_KEY = (index_pb2.PublishEventsRequest.DESCRIPTOR.fields_by_name["events"].number
               << 3) | 2
_SEQ = b"\x08"       # KvEvent.seq = 1, varint
_STORED = b"\x12"    # KvEvent.stored = 2, length-delimited
_REMOVED = b"\x1a"   # KvEvent.removed = 3
_CLEARED = b"\x22\x00"  # KvEvent.cleared = 4, an empty message
_HASH = b"\x0a"      # BlockStored/BlockRemoved.block_hashes = 1
_PARENT = b"\x12"    # BlockStored.parent_hash = 2
_STORED_TIER = b"\x18"   # BlockStored.tier = 3
_REMOVED_TIER = b"\x10"  # BlockRemoved.tier = 2


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = tuple(_varint(n) for n in range(1 << 14))  # one or two bytes: every length here


def varint(n: int) -> bytes:
    """Protobuf's base-128 varint of ``n >= 0``."""
    return _SMALL[n] if n < 16384 else _varint(n)


def _seq(seq: int) -> bytes:
    return _SEQ + varint(seq) if seq else b""  # proto3 leaves a zero out


def _hashes(hashes: Sequence[bytes]) -> bytes:
    if not hashes:
        return b""
    size = len(hashes[0])
    if size < 0x80 and set(map(len, hashes)) == {size}:  # every chain hash of one algo
        key = _HASH + _SMALL[size]
        return key + key.join(hashes)
    return b"".join(_HASH + varint(len(h)) + h for h in hashes)


class Wire:
    """One index event as a request's ``events`` entry (``entry``), with its ``seq`` and its
    block hash count (``hashes``; what ``Pending`` weighs it by)."""

    __slots__ = ("seq", "hashes", "entry")

    def __init__(self, seq: int, hashes: int, event: bytes) -> None:
        self.seq, self.hashes = seq, hashes
        self.entry = bytes((_EVENTS_KEY,)) + varint(len(event)) + event

    @property
    def event(self) -> bytes:
        """The ``KvEvent``'s serialized bytes (the entry without its key and length)."""
        i = 1  # past the key: the length's varint ends at the first byte below 0x80
        while self.entry[i] & 0x80:
            i += 1
        return self.entry[i + 1:]

    @classmethod
    def stored(cls, seq: int, hashes: Sequence[bytes], parent: bytes, tier: int) -> Wire:
        body = _hashes(hashes)
        if parent:
            body += _PARENT + varint(len(parent)) + parent
        if tier:
            body += _STORED_TIER + _SMALL[tier]
        return cls(seq, len(hashes), _seq(seq) + _STORED + varint(len(body)) + body)

    @classmethod
    def removed(cls, seq: int, hashes: Sequence[bytes], tier: int) -> Wire:
        body = _hashes(hashes)
        if tier:
            body += _REMOVED_TIER + _SMALL[tier]
        return cls(seq, len(hashes), _seq(seq) + _REMOVED + varint(len(body)) + body)

    @classmethod
    def cleared(cls, seq: int) -> Wire:
        return cls(seq, 0, _seq(seq) + _CLEARED)

