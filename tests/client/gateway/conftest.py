"""A live gateway (uvicorn on a loopback port, in a thread) over fake kvmesh gRPC servers.

The stack is built once per test module; ``stack`` resets the fakes' scripted behaviour and
recordings before every test, so tests only set what they need.
"""
from __future__ import annotations

import socket
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
import uvicorn
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from client.gateway.app import GatewayConfig, create_app
from client.gateway.tenants import Tenancy
from deploy.waiting import wait_until
from kvmesh.v1 import index_pb2, index_pb2_grpc, worker_pb2_grpc
from tests.client.fake_servers import FakeIndex, FakeWorker, candidate, start_server

TENANT_KEYS = {"key-acme": "acme", "key-globex": "globex"}
SECRET = "test-secret"
METRICS_KEY = "metrics-key-of-the-operator"
W1_CACHED = 3


class LiveGateway:
    """``create_app(config)`` served by uvicorn on a free loopback port in a thread."""

    def __init__(self, config: GatewayConfig) -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(create_app(config), log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started or not self.thread.is_alive(), 10,
                   interval=0.01, what="gateway start")
        if not self.server.started:
            raise RuntimeError("gateway did not start")

    def openai(self, api_key: str = "unused") -> OpenAI:
        """An official OpenAI client for this gateway (no retries: errors surface at once)."""
        return OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=10)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def metric_samples(url: str, key: str | None = METRICS_KEY) -> Samples:
    """Every sample of ``{url}/metrics`` (with the metrics key), by name and labels."""
    headers = {"authorization": f"Bearer {key}"} if key else {}
    with urllib.request.urlopen(urllib.request.Request(f"{url}/metrics", headers=headers),
                                timeout=5) as resp:
        assert resp.headers["content-type"].startswith("text/plain")
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def metric_delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


@dataclass
class Stack:
    index: FakeIndex
    w1: FakeWorker
    w2: FakeWorker
    w1_address: str
    w2_address: str
    index_address: str
    gateway: LiveGateway          # no tenant keys: cache_salt passes through, else random
    tenant_gateway: LiveGateway   # --tenant-keys TENANT_KEYS with SECRET

    def reset(self) -> None:
        self.index.candidates = [candidate("w1", self.w1_address, matched=3),
                                 candidate("w2", self.w2_address)]
        self.index.error = None
        self.index.hang = False
        self.index.stats = index_pb2.StatsResponse()
        self.index.routes.clear()
        for worker, cached in ((self.w1, W1_CACHED), (self.w2, 0)):
            worker.mode = "ok"
            worker.fail_after = 0
            worker.cached = cached
            worker.cached_by_tier = {}
            worker.requests.clear()

    @property
    def last_request(self):
        """The last GenerateRequest any worker received."""
        reqs = self.w1.requests + self.w2.requests
        assert reqs, "no worker received a request"
        return reqs[-1]


@pytest.fixture(scope="module")
def _stack() -> Iterator[Stack]:
    servers: list[grpc.Server] = []
    index, w1, w2 = FakeIndex(), FakeWorker("w1"), FakeWorker("w2")
    server, index_address = start_server(index, index_pb2_grpc.add_IndexServiceServicer_to_server)
    servers.append(server)
    addresses = []
    for worker in (w1, w2):
        server, address = start_server(worker,
                                       worker_pb2_grpc.add_WorkerServiceServicer_to_server)
        servers.append(server)
        addresses.append(address)
    # health_ttl_s=0: /health asks the fake index every time, so each test sees its own
    plain = LiveGateway(GatewayConfig(service=index_address, generate_timeout=5,
                                      metrics_key=METRICS_KEY, health_ttl_s=0))
    tenants = LiveGateway(GatewayConfig(service=index_address, generate_timeout=5,
                                        tenancy=Tenancy(TENANT_KEYS, SECRET),
                                        metrics_key=METRICS_KEY, health_ttl_s=0))
    stack = Stack(index, w1, w2, addresses[0], addresses[1], index_address, plain, tenants)
    yield stack
    plain.stop()
    tenants.stop()
    for server in servers:
        server.stop(0)


@pytest.fixture
def stack(_stack: Stack) -> Stack:
    _stack.reset()
    return _stack
