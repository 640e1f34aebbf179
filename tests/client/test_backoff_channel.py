"""The shared failover pieces in ``kvmesh/``: ``Backoff`` (bounds, growth, cap, jitter),
``ReplicaRing`` rotation on failure and the ``Dialer``'s channel options."""
from __future__ import annotations

import random
from concurrent import futures

import grpc
import pytest

from kvmesh.rpc.channel import CHANNEL_OPTIONS, Dialer
from kvmesh.rpc.retry import Backoff, ReplicaRing
from kvmesh.rpc.tls import TlsFiles
from kvmesh.v1 import worker_pb2, worker_pb2_grpc


def test_backoff_grows_to_its_cap_within_bounds_and_resets() -> None:
    backoff = Backoff(base=0.1, cap=1.0, rand=random.Random(7))
    ceilings = []
    for _ in range(8):
        ceiling = backoff.ceiling
        wait = backoff.next()
        assert 0.0 <= wait <= ceiling
        ceilings.append(ceiling)
    assert ceilings == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0])
    backoff.reset()
    assert backoff.ceiling == 0.1 and backoff.next() <= 0.1


def test_backoff_jitter_is_full_and_seeded() -> None:
    waits = [Backoff(base=1.0, cap=1.0, rand=random.Random(3)).next() for _ in range(3)]
    assert len(set(waits)) == 1  # the same seed, the same draw
    spread = Backoff(base=1.0, cap=1.0, rand=random.Random(5))
    draws = [spread.next() for _ in range(200)]
    assert min(draws) < 0.1 and max(draws) > 0.9  # full jitter: anywhere in [0, ceiling]


def test_backoff_refuses_nonsense() -> None:
    for kwargs in ({"base": 0}, {"base": 2.0, "cap": 1.0}, {"factor": 0.5}):
        with pytest.raises(ValueError):
            Backoff(**kwargs)


def test_ring_moves_past_a_failed_current_replica_only() -> None:
    ring = ReplicaRing(["a", "b", "c"])
    ring.mark_failed("a")
    assert ring.current == "b" and ring.order() == ["b", "c", "a"]
    ring.mark_failed("a")  # a stale report (the other task already moved): nothing changes
    assert ring.current == "b"
    ring.mark_failed("b")
    ring.mark_failed("c")
    assert ring.current == "a"
    with pytest.raises(ValueError):
        ReplicaRing([])


def test_dialer_options_follow_tls() -> None:
    assert Dialer.from_tls(None) == Dialer(None, CHANNEL_OPTIONS)
    plain_named = Dialer.from_tls(TlsFiles(server_name="kvmesh.internal"))
    assert plain_named.credentials is None and plain_named.options == CHANNEL_OPTIONS


class _BigStats(worker_pb2_grpc.WorkerServiceServicer):
    def Stats(self, request, context):
        return worker_pb2.WorkerStatsResponse(model="m" * (6 * 1024 * 1024))


def test_dialer_channels_accept_messages_over_grpcs_default_limit() -> None:
    """6 MiB answers: over gRPC's default 4 MiB receive limit, under CHANNEL_OPTIONS' 64."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(_BigStats(), server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    try:
        with grpc.insecure_channel(address) as plain:
            with pytest.raises(grpc.RpcError) as info:
                worker_pb2_grpc.WorkerServiceStub(plain).Stats(
                    worker_pb2.WorkerStatsRequest(), timeout=10)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with Dialer().sync(address) as channel:
            answer = worker_pb2_grpc.WorkerServiceStub(channel).Stats(
                worker_pb2.WorkerStatsRequest(), timeout=10)
        assert len(answer.model) == 6 * 1024 * 1024
    finally:
        server.stop(0)
