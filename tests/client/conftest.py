"""Fixtures for the client tests: servers on loopback ports, and both client flavours."""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from client import AsyncKvmeshClient, KvmeshClient
from kvmesh.v1 import index_pb2_grpc, worker_pb2_grpc
from tests.client.fake_servers import FakeIndex, FakeWorker, start_server


class Cluster:
    """Starts fake services and workers; stops them all at teardown."""

    def __init__(self) -> None:
        self.servers: list[grpc.Server] = []

    def index(self, servicer: FakeIndex) -> str:
        server, address = start_server(servicer, index_pb2_grpc.add_IndexServiceServicer_to_server)
        self.servers.append(server)
        return address

    def worker(self, servicer: FakeWorker) -> str:
        server, address = start_server(servicer,
                                       worker_pb2_grpc.add_WorkerServiceServicer_to_server)
        self.servers.append(server)
        return address

    def stop(self) -> None:
        for server in self.servers:
            server.stop(0)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    yield c
    c.stop()


class AsyncDriven:
    """Drives an ``AsyncKvmeshClient`` on its own event loop behind the blocking interface,
    so one test body checks that both clients behave the same."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._client = AsyncKvmeshClient(*args, **kwargs)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._client, name)
        return lambda *a, **kw: self._loop.run_until_complete(method(*a, **kw))

    def close(self) -> None:
        if not self._loop.is_closed():
            self._loop.run_until_complete(self._client.close())

    def shutdown(self) -> None:
        self.close()
        self._loop.close()


@pytest.fixture(params=["sync", "async"])
def make_client(request: pytest.FixtureRequest) -> Iterator[Callable[..., Any]]:
    """Factory for a client of either flavour (closed at teardown)."""
    made: list[Any] = []

    def make(*args: Any, **kwargs: Any) -> Any:
        kind = KvmeshClient if request.param == "sync" else AsyncDriven
        client = kind(*args, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        getattr(client, "shutdown", client.close)()
