"""The link's channel to the index service: one replica at a time, the next on failure.

Each ``Conn`` belongs to one event loop (gRPC aio channels do): the bridge's links hold one
for their events (the ingest loop) and one for their heartbeats (the beat thread's loop).

``PublishEvents`` goes out serialized by the link (:func:`publish_request`): each queued
index event is serialized once and framed as the request's repeated ``events`` field, where
building a ``PublishEventsRequest`` message copied every event into it and gRPC then
serialized the copy (together a third of the link's CPU per event).
"""
from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence

import grpc
import grpc.aio

from kvmesh.events.wire import Wire
from kvmesh.rpc.channel import CHANNEL_OPTIONS, Dialer
from kvmesh.rpc.retry import ReplicaRing
from kvmesh.v1 import index_pb2, index_pb2_grpc

# protobuf's key of PublishEventsRequest.events: field number, wire type 2 (length-delimited)
_EVENTS_KEY = (index_pb2.PublishEventsRequest.DESCRIPTOR.fields_by_name["events"].number
               << 3) | 2


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


def publish_request(head: bytes, events: Sequence[index_pb2.KvEvent | Wire]) -> bytes:
    """The serialized ``PublishEventsRequest`` of ``head`` (``publish_head``) and ``events``
    (messages, or ``Wire`` entries as they are), in order. Protobuf parses fields in any
    order, a repeated message field entry by entry, so this parses to the message built from
    the same fields."""
    parts = [head]
    for ev in events:
        if type(ev) is Wire:
            parts.append(ev.entry)
            continue
        data = ev.SerializeToString()
        parts.append(_event_key(len(data)))
        parts.append(data)
    return b"".join(parts)


class Stub(index_pb2_grpc.IndexServiceStub):
    """``IndexService``'s stub, its ``PublishEvents`` taking the request already serialized
    (``publish_request``'s bytes); every other method as generated."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        super().__init__(channel)
        self.PublishEvents = channel.unary_unary(  # gRPC's name
            "/kvmesh.v1.IndexService/PublishEvents", request_serializer=None,
            response_deserializer=index_pb2.PublishEventsResponse.FromString,
            _registered_method=True)


class Conn:
    """The current service replica's stub; a failure the retry table sends elsewhere moves
    to the next address (reported by either task: only the first report of a stub moves).
    Channels get their own subchannel pool, as the worker's link does."""

    def __init__(self, addresses: list[str], credentials: grpc.ChannelCredentials | None) -> None:
        self.ring = ReplicaRing(addresses)
        self.credentials = credentials
        self._dialer = Dialer(credentials,
                              CHANNEL_OPTIONS + (("grpc.use_local_subchannel_pool", 1),))
        self._channel: grpc.aio.Channel | None = None
        self._stub: Stub | None = None
        self._closing: set[asyncio.Task] = set()

    def stub(self) -> Stub:
        if self._stub is None:
            self._channel = self._dialer.aio(self.ring.current)
            self._stub = Stub(self._channel)
        return self._stub

    def next_replica(self, failed: Stub) -> None:
        if self._stub is not failed:
            return
        channel, self._channel, self._stub = self._channel, None, None
        self.ring.mark_failed(self.ring.current)
        if channel is not None:  # in the background: the other task may have a call on it
            task = asyncio.create_task(channel.close(grace=1.0))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
