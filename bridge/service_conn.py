"""The link's channel to the index service: one replica at a time, the next on failure.

Each ``Conn`` belongs to one event loop (gRPC aio channels do): the bridge's links hold one
for their events (the ingest loop) and one for their heartbeats (the beat thread's loop).
"""
from __future__ import annotations

import asyncio

import grpc
import grpc.aio

from kvmesh.channel import CHANNEL_OPTIONS, Dialer
from kvmesh.retry import ReplicaRing
from kvmesh.v1 import index_pb2_grpc

Stub = index_pb2_grpc.IndexServiceStub


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
