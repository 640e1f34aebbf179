"""``kvmesh.rpc.channel``: the ``Dialer``'s channel options."""
from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from kvmesh.rpc.channel import CHANNEL_OPTIONS, Dialer
from kvmesh.rpc.tls import TlsFiles
from kvmesh.v1 import worker_pb2, worker_pb2_grpc


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
