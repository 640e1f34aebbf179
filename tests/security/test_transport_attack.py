"""Attack: large requests without a token must not cost the service their size in memory.

A real ``python -m service`` process with a router token and the default 16 MiB request
limit. Several concurrent 12 MiB Route calls without a token are refused UNAUTHENTICATED
before their body is read, so the process's resident memory (``VmRSS``, sampled all
through the attack) grows by far less than the bytes sent; a request over the limit is
refused RESOURCE_EXHAUSTED by the transport; the service keeps answering.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from deploy.process import ServerProcess
from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration  # a real service process

TOKEN = "router-token-for-the-transport-attack"
MIB = 1 << 20
ROUTE = "/kvmesh.v1.IndexService/Route"


def rss(pid: int) -> int:
    """Resident memory of ``pid`` in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class PeakRss:
    """Samples a process's VmRSS every few ms in a thread; ``peak`` is the highest seen."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss(self.pid))
            time.sleep(0.002)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss(self.pid))


@pytest.fixture(scope="module")
def service() -> Iterator[ServerProcess]:
    proc = ServerProcess("limits-service", "service",
                         ["--port", "0", "--backend", "memory", "--log-level", "error"],
                         env={"KVMESH_TOKEN": TOKEN,
                              "KVMESH_WORKER_SECRET": "worker-secret-of-this-attack"}).start()
    try:
        yield proc
    finally:
        proc.stop()


def _route_bytes(size: int) -> bytes:
    """A well-formed RouteRequest of about ``size`` bytes (a long salt)."""
    return pb.RouteRequest(token_ids=[1, 2, 3], salt="s" * size).SerializeToString()


def _call(channel: grpc.Channel, payload: bytes, metadata: tuple = ()) -> grpc.StatusCode:
    raw = channel.unary_unary(ROUTE)
    try:
        raw(payload, metadata=metadata, timeout=60)
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def test_unauthenticated_large_requests_are_refused_before_they_are_read(
        service: ServerProcess) -> None:
    n, size = 4, 12 * MIB
    payload = _route_bytes(size)
    channels = [grpc.insecure_channel(service.address, options=[
        ("grpc.use_local_subchannel_pool", 1), ("grpc.max_send_message_length", 64 * MIB)])
        for _ in range(n)]
    try:
        for ch in channels:  # connected, and the service warm, before the baseline
            assert _call(ch, b"") == grpc.StatusCode.UNAUTHENTICATED
        before = rss(service.pid)
        codes: list[grpc.StatusCode] = []
        with PeakRss(service.pid) as mem:
            threads = [threading.Thread(target=lambda c=ch: codes.append(_call(c, payload)))
                       for ch in channels]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert codes == [grpc.StatusCode.UNAUTHENTICATED] * n
        grown = mem.peak - before
        # The old code held every body (up to 2x the limit each): ~100 MiB here; now only
        # HTTP/2 flow-control windows (measured ~8 MiB).
        assert grown < n * size / 3, (
            f"RSS grew {grown / MIB:.1f} MiB for {n * size / MIB:.0f} MiB sent")
    finally:
        for ch in channels:
            ch.close()


def test_a_request_over_the_limit_is_refused_by_the_transport(service: ServerProcess) -> None:
    auth = (("authorization", f"Bearer {TOKEN}"),)
    with grpc.insecure_channel(service.address, options=[
            ("grpc.max_send_message_length", 64 * MIB)]) as ch:
        assert _call(ch, _route_bytes(17 * MIB), auth) == grpc.StatusCode.RESOURCE_EXHAUSTED
        stub = pb_grpc.IndexServiceStub(ch)
        assert stub.Stats(pb.StatsRequest(), metadata=auth, timeout=10).workers is not None
