"""The link's channel to the index service: one replica at a time, the next on failure.

Replicas are interchangeable (all their state is in Redis). When a call fails in a way
``kvmesh.rpc.retry.TABLE`` retries on another replica, :meth:`Conn.next_replica` moves to
the next address of the :class:`~kvmesh.rpc.retry.ReplicaRing`. The link's tasks may share
one ``Conn`` and report the same failed stub: only the first report moves on. Each ``Conn``
belongs to one event loop (gRPC aio channels do): a link whose beats run on a
``BeatThread`` holds a second one there.

Channels come from ``kvmesh.rpc.channel.Dialer`` (the options every kvmesh client uses) with
a subchannel pool of their own: gRPC otherwise shares one connection among channels with
equal options, and the link's attempts to reach a replica that is down would put a client in
the same process (a gateway, a test) into that connection's failure backoff.
"""
from __future__ import annotations

import asyncio

import grpc
import grpc.aio

from kvmesh.rpc.channel import CHANNEL_OPTIONS, Dialer
from kvmesh.rpc.retry import ReplicaRing
from kvmesh.v1 import index_pb2, index_pb2_grpc


class Stub(index_pb2_grpc.IndexServiceStub):
    """``IndexService``'s stub, its ``PublishEvents`` taking the request already serialized
    (``kvmesh.link.request.publish_request``'s bytes); every other method as generated."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        super().__init__(channel)
        self.PublishEvents = channel.unary_unary(  # gRPC's name
            "/kvmesh.v1.IndexService/PublishEvents", request_serializer=None,
            response_deserializer=index_pb2.PublishEventsResponse.FromString,
            _registered_method=True)


class Conn:
    """The current replica's stub, built on first use after each move."""

    def __init__(self, addresses: list[str], credentials: grpc.ChannelCredentials | None,
                 close_grace_s: float = 1.0) -> None:
        self.ring = ReplicaRing(addresses)
        self.credentials = credentials
        self._dialer = Dialer(credentials,
                              CHANNEL_OPTIONS + (("grpc.use_local_subchannel_pool", 1),))
        self._grace = close_grace_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: Stub | None = None
        self._closing: set[asyncio.Task] = set()  # old channels being closed

    def twin(self) -> Conn:
        """A ``Conn`` to the same addresses, for another event loop."""
        return Conn(self.ring.addresses, self.credentials, self._grace)

    def stub(self) -> Stub:
        """The stub of the current replica (a channel is dialled when there is none)."""
        if self._stub is None:
            self._channel = self._dialer.aio(self.ring.current)
            self._stub = Stub(self._channel)
        return self._stub

    def next_replica(self, failed: Stub) -> None:
        """Move on to the next replica, unless another task already left ``failed``."""
        if self._stub is not failed:
            return
        channel, self._channel, self._stub = self._channel, None, None
        self.ring.mark_failed(self.ring.current)
        if channel is not None:  # in the background: the other task may have a call on it
            task = asyncio.create_task(channel.close(grace=self._grace))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Close the current channel (calls on it end as CANCELLED)."""
        if self._channel is not None:
            await self._channel.close()
