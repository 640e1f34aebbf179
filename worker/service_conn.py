"""The service link's connection: one channel to the service replica it talks to now.

Replicas are interchangeable (all their state is in Redis). The link's two tasks share this
connection; when a call fails in a way ``kvmesh.rpc.retry.TABLE`` retries on another replica,
:meth:`ServiceConn.next_replica` moves to the next address of the
:class:`~kvmesh.rpc.retry.ReplicaRing`. Both tasks may report the same failed channel: only the
first report moves on. Channels come from ``kvmesh.rpc.channel.Dialer`` (the options every
kvmesh client uses) with a subchannel pool of their own: gRPC otherwise shares one
connection among channels with equal options, and the link's attempts to reach a replica
that is down would put a client in the same process (a gateway, a test) into that
connection's failure backoff, failing its calls fast after the replica is back.
"""
from __future__ import annotations

import asyncio

import grpc
import grpc.aio

from kvmesh.rpc.channel import CHANNEL_OPTIONS, Dialer
from kvmesh.rpc.retry import ReplicaRing
from kvmesh.v1 import index_pb2_grpc


class ServiceConn:
    """The current replica's stub, built on first use after each move."""

    def __init__(self, addresses: list[str], credentials: grpc.ChannelCredentials | None,
                 close_grace_s: float) -> None:
        self.ring = ReplicaRing(addresses)
        self._dialer = Dialer(credentials,
                              CHANNEL_OPTIONS + (("grpc.use_local_subchannel_pool", 1),))
        self._grace = close_grace_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: index_pb2_grpc.IndexServiceStub | None = None
        self._closing: set[asyncio.Task] = set()  # old channels being closed

    def stub(self) -> index_pb2_grpc.IndexServiceStub:
        """The stub of the current replica (a channel is dialled when there is none)."""
        if self._stub is None:
            self._channel = self._dialer.aio(self.ring.current)
            self._stub = index_pb2_grpc.IndexServiceStub(self._channel)
        return self._stub

    def next_replica(self, failed: index_pb2_grpc.IndexServiceStub) -> None:
        """Move on to the next replica, unless the other task already left ``failed``."""
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
