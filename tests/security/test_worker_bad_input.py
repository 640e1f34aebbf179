"""Property: whatever bytes arrive, a worker answers with a deliberate status, stays up, and a
refused call leaves its KV cache and counters exactly as they were.

One ``python -m worker`` process (tiny model, 64 blocks of 16, small message limit set by
its flag); hypothesis drives every WorkerService RPC with random and malformed requests and
raw bytes (``tests.malformed``) through a generic channel.
"""
from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from deploy.process import ServerProcess
from kvmesh.v1 import worker_pb2, worker_pb2_grpc
from tests.malformed import Limits, worker_requests

pytestmark = pytest.mark.integration  # a worker process, fuzzed

LIMITS = Limits()
OK = grpc.StatusCode.OK
REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
STRATEGIES = worker_requests(LIMITS, vocab=259)


class Fuzzed:
    def __init__(self, proc: ServerProcess) -> None:
        self.proc = proc
        self.channel = grpc.insecure_channel(proc.address)
        self.stub = worker_pb2_grpc.WorkerServiceStub(self.channel)

    def call(self, method: str, payload: bytes) -> tuple[grpc.StatusCode, str]:
        path = f"/kvmesh.v1.WorkerService/{method}"
        try:
            if method in ("Stats", "Pin"):
                self.channel.unary_unary(path)(payload, timeout=30)
            else:
                for _ in self.channel.unary_stream(path)(payload, timeout=30):
                    pass
        except grpc.RpcError as e:
            return e.code(), e.details() or ""
        return OK, ""

    def state(self) -> tuple:
        """The cache and counters a refused call must not change."""
        s = self.stub.Stats(worker_pb2.WorkerStatsRequest(), timeout=10)
        c = s.cache
        return (c.queries, c.hits, c.evictions, c.used_blocks, c.cached_blocks, c.free_blocks,
                s.requests_done, s.load.running, s.load.waiting)


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[Fuzzed]:
    proc = ServerProcess("fuzzed-worker", "worker", [
        "--port", "0", "--num-blocks", "64", "--block-size", "16", "--worker-id", "fuzz",
        "--max-message-bytes", str(LIMITS.max_message_bytes)]).start(timeout=120)
    f = Fuzzed(proc)
    try:
        yield f
    finally:
        f.channel.close()
        proc.stop()


@pytest.mark.parametrize("method", sorted(STRATEGIES))
@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.large_base_example])
@given(data=st.data())
def test_every_call_gets_a_deliberate_answer_and_refusals_change_nothing(
        fuzzed: Fuzzed, method: str, data: st.DataObject) -> None:
    payload = data.draw(STRATEGIES[method], label="request bytes")
    before = fuzzed.state()
    code, details = fuzzed.call(method, payload)
    event(code.name)
    # FetchBlocks: no fuzzed ticket verifies (the service's keys mint them)
    allowed = REFUSALS | ({grpc.StatusCode.PERMISSION_DENIED} if method == "FetchBlocks"
                          else {OK})
    assert code in allowed, (code, details)
    if code != OK:
        assert details, "every refusal says why"
        assert fuzzed.state() == before, f"{method} refused ({code}) but changed the worker"
    if len(payload) > LIMITS.max_message_bytes:
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_the_worker_survived_and_still_generates(fuzzed: Fuzzed) -> None:
    assert fuzzed.proc.alive
    req = worker_pb2.GenerateRequest(token_ids=[1, 2, 3], sampling=worker_pb2.SamplingParams(
        max_tokens=2, ignore_eos=True))
    msgs = list(fuzzed.stub.Generate(req, timeout=30))
    assert msgs[-1].finished and sum(len(m.token_ids) for m in msgs) == 2
    state = fuzzed.state()
    assert state[7:] == (0, 0), "nothing is left running or waiting"
