"""``PublishEvents`` requests serialized by the link, each event serialized once.

The link frames each queued index event as an entry of the request's repeated ``events``
field after a serialized head (``worker_id``, ``incarnation``): building a
``PublishEventsRequest`` message copied every event into it and gRPC then serialized the
copy (together a third of the link's CPU per event). Protobuf parses fields in any order, a
repeated message field entry by entry, so the bytes parse to the message built from the
same fields. An event that is not an ``index_pb2.KvEvent`` is taken as already framed: its
``entry`` is the key, length and bytes of one ``events`` entry (the bridge's ``Wire``).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Protocol

from kvmesh.v1 import index_pb2

# protobuf's key of PublishEventsRequest.events: field number, wire type 2 (length-delimited)
_EVENTS_KEY = (index_pb2.PublishEventsRequest.DESCRIPTOR.fields_by_name["events"].number
               << 3) | 2
_KvEvent = index_pb2.KvEvent


class Framed(Protocol):
    """An index event already in wire form: one ``events`` entry, key and length included."""

    entry: bytes


@functools.lru_cache(maxsize=4096)
def _event_key(size: int) -> bytes:
    """The key and varint length that precede an ``events`` entry of ``size`` bytes."""
    out = bytearray((_EVENTS_KEY,))
    while size > 0x7F:
        out.append(size & 0x7F | 0x80)
        size >>= 7
    out.append(size)
    return bytes(out)


def publish_head(worker_id: str, incarnation: int) -> bytes:
    """A ``PublishEventsRequest``'s fields other than its events, serialized."""
    return index_pb2.PublishEventsRequest(worker_id=worker_id,
                                          incarnation=incarnation).SerializeToString()


def publish_request(head: bytes, events: Sequence[index_pb2.KvEvent | Framed]) -> bytes:
    """The serialized ``PublishEventsRequest`` of ``head`` (``publish_head``) and ``events``
    (messages, or framed entries as they are), in order."""
    parts = [head]
    for ev in events:
        if type(ev) is not _KvEvent:
            parts.append(ev.entry)
            continue
        data = ev.SerializeToString()
        parts.append(_event_key(len(data)))
        parts.append(data)
    return b"".join(parts)
