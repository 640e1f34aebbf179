"""Attack: a small Route with thousands of multimodal items stalls the service's loop.

Hashing costs blocks x items. A real ``python -m service`` process: a 2,000-item Route is
refused INVALID_ARGUMENT at once, and while a large-but-allowed Route (64 items over a
long prompt) hashes, Stats calls on another connection keep being answered: hashing that
big runs in a thread, off the event loop.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from deploy.process import ServerProcess
from kvmesh.hashing import none_hash
from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration  # a real service process


@pytest.fixture(scope="module")
def service() -> Iterator[ServerProcess]:
    proc = ServerProcess("mm-service", "service",
                         ["--port", "0", "--backend", "memory", "--log-level", "error"]).start()
    try:
        yield proc
    finally:
        proc.stop()


def _route(n_tokens: int, n_items: int) -> pb.RouteRequest:
    mm = [pb.MultimodalItem(identifier=f"img{i}", offset=0, length=n_tokens)
          for i in range(n_items)]
    return pb.RouteRequest(token_ids=list(range(n_tokens)), mm=mm, dry_run=True)


def test_many_multimodal_items_are_refused_and_big_hashing_leaves_the_loop_free(
        service: ServerProcess) -> None:
    with grpc.insecure_channel(service.address) as ch:
        stub = pb_grpc.IndexServiceStub(ch)
        stub.RegisterWorker(pb.RegisterWorkerRequest(
            worker_id="w", address="127.0.0.1:9000", model="tiny", block_size=16,
            hash_algo="sha256_cbor", root_hash=none_hash("sha256_cbor", None),
            load=pb.WorkerLoad(total_blocks=64, free_blocks=64)), timeout=10)
        t = time.perf_counter()
        with pytest.raises(grpc.RpcError) as err:
            stub.Route(_route(8192, 2000), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "the limit is 64" in err.value.details()
        assert time.perf_counter() - t < 2.0  # the old code hashed for seconds first

        big = _route(8192 * 4, 64)  # 2,048 blocks x 65: hashed in a thread
        done = threading.Event()
        answer: list[object] = []

        def hash_big() -> None:
            try:
                answer.append(stub.Route(big, timeout=120))
            finally:
                done.set()

        with grpc.insecure_channel(service.address, options=[
                ("grpc.use_local_subchannel_pool", 1)]) as other:
            probe = pb_grpc.IndexServiceStub(other)
            probe.Stats(pb.StatsRequest(), timeout=10)
            threading.Thread(target=hash_big, daemon=True).start()
            worst, answered = 0.0, 0
            while not done.is_set():
                t = time.perf_counter()
                probe.Stats(pb.StatsRequest(), timeout=30)
                worst = max(worst, time.perf_counter() - t)
                answered += 1
            assert answer, "the big Route failed"
            # a loop blocked by the hashing would answer nothing until it ended
            assert answered >= 2, answered
            assert worst < 1.0, worst
