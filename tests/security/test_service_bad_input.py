"""Property: whatever bytes arrive, the metadata service answers with a deliberate status,
stays up, and a refused call leaves the Redis index exactly as it was.

One ``python -m service`` process over the session's Valkey, with small limits set by its
flags; hypothesis drives every IndexService RPC with random and malformed requests and raw
bytes (``tests.malformed``) through a generic channel. The whole Redis keyspace is dumped
before and after each call.
"""
from __future__ import annotations

import re
from collections.abc import Iterator

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from deploy.process import ServerProcess
from deploy.redis_server import RedisServer
from kvmesh.hashing import block_hashes, none_hash
from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc as pb_grpc
from service.index.redis import keys, lua
from tests.malformed import HASH_POOL, KNOWN_WORKERS, Limits, index_requests

LIMITS = Limits()
OK = grpc.StatusCode.OK
# What a refusal may say: the caller's fault, a size limit, register first, wrong hash seed.
# ALREADY_EXISTS: a fuzzed RegisterWorker for a live worker id from another address
# (docs/security.md: a live id is never taken over).
REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
            grpc.StatusCode.ALREADY_EXISTS}
PROVISIONAL = re.compile(rb"^p\{|^kvm:\{ctl\}:pm:")  # provisional: they expire on their own
STRATEGIES = index_requests(LIMITS)


class Fuzzed:
    """The service process, a raw channel to it, and the Redis it writes."""

    def __init__(self, proc: ServerProcess, redis_client: redis.Redis) -> None:
        self.proc = proc
        self.redis = redis_client
        self.channel = grpc.insecure_channel(proc.address)
        self.stub = pb_grpc.IndexServiceStub(self.channel)
        self.seqs = dict.fromkeys(KNOWN_WORKERS, 0)
        self.sweep = redis_client.register_script(lua.text("sweep"))

    def call(self, method: str, payload: bytes) -> tuple[grpc.StatusCode, str]:
        rpc = self.channel.unary_unary(f"/kvmesh.v1.IndexService/{method}")
        try:
            rpc(payload, timeout=10)
        except grpc.RpcError as e:
            return e.code(), e.details() or ""
        return OK, ""

    def join(self, worker_id: str, port: int) -> None:
        """Register a well-behaved worker holding two chains."""
        self.stub.RegisterWorker(pb.RegisterWorkerRequest(
            worker_id=worker_id, address=f"127.0.0.1:{port}", model="tiny", block_size=4,
            hash_algo="sha256_cbor", root_hash=none_hash("sha256_cbor")))
        self.stub.SyncWorker(pb.SyncWorkerRequest(worker_id=worker_id, seq=0))
        chains = [block_hashes(list(range(9)), 4), [HASH_POOL[0], HASH_POOL[1]]]
        for chain in chains:
            self.seqs[worker_id] += 1
            self.stub.PublishEvents(pb.PublishEventsRequest(worker_id=worker_id, events=[
                pb.KvEvent(seq=self.seqs[worker_id], stored=pb.BlockStored(
                    block_hashes=chain))]))

    def keep_alive(self) -> None:
        """Heartbeat the known workers (re-registering any the fuzzing replaced or purged)
        and finish the sweep of retired entries, so liveness and the janitor never change
        the index during a call."""
        for i, wid in enumerate(KNOWN_WORKERS):
            res = self.stub.Heartbeat(pb.HeartbeatRequest(worker_id=wid))
            if res.reregister:
                self.seqs[wid] = 0
                self.join(wid, 9000 + i)
        while self.sweep([keys.SWEEP, keys.DEAD, keys.CYCLE, keys.FREE], [1000])[0] != 0:
            pass

    def dump(self) -> dict[bytes, object]:
        """Every key of the index with its type and value."""
        keys = sorted(self.redis.scan_iter(count=1000))
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.type(key)
        types = pipe.execute()
        readers = {b"string": pipe.get, b"hash": pipe.hgetall, b"set": pipe.smembers,
                   b"zset": lambda k: pipe.zrange(k, 0, -1, withscores=True),
                   b"list": lambda k: pipe.lrange(k, 0, -1)}
        for key, kind in zip(keys, types, strict=True):
            readers.get(kind, pipe.type)(key)
        values = pipe.execute()
        return {k: (t, v) for k, t, v in zip(keys, types, values, strict=True)
                if t != b"none" and v is not None}  # gone (expired) while being read


def unchanged(before: dict[bytes, object], after: dict[bytes, object]) -> bool:
    """Equal, except that provisional entries may have expired in between."""
    def durable(d: dict[bytes, object]) -> dict[bytes, object]:
        return {k: v for k, v in d.items() if not PROVISIONAL.search(k)}

    expired_only = all(before.get(k) == v for k, v in after.items() if PROVISIONAL.search(k))
    return durable(before) == durable(after) and expired_only


@pytest.fixture(scope="module")
def fuzzed(redis_server: RedisServer) -> Iterator[Fuzzed]:
    if not redis_server.alive:
        redis_server.start()
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    flags = ["--port", "0", "--redis-url", redis_server.url, "--log-level", "error",
             "--max-message-bytes", str(LIMITS.max_message_bytes),
             "--max-prompt-tokens", str(LIMITS.max_prompt_tokens),
             "--max-batch-events", str(LIMITS.max_batch_events),
             "--max-batch-hashes", str(LIMITS.max_batch_hashes),
             "--max-snapshot-blocks", str(LIMITS.max_snapshot_blocks)]
    proc = ServerProcess("fuzzed-service", "service", flags).start()
    f = Fuzzed(proc, client)
    try:
        f.keep_alive()
        yield f
    finally:
        f.channel.close()
        proc.stop()
        client.flushall()
        client.close()


@pytest.mark.parametrize("method", sorted(STRATEGIES))
@settings(max_examples=60, deadline=None, derandomize=False,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.large_base_example])
@given(data=st.data())
def test_every_call_gets_a_deliberate_answer_and_refusals_change_nothing(
        fuzzed: Fuzzed, method: str, data: st.DataObject) -> None:
    payload = data.draw(STRATEGIES[method], label="request bytes")
    fuzzed.keep_alive()
    before = fuzzed.dump()
    code, details = fuzzed.call(method, payload)
    event(code.name)  # --hypothesis-show-statistics: how often each answer came
    no_worker = method in ("Route", "PinPrefix", "UnpinPrefix") and "no live worker" in details
    assert code == OK or code in REFUSALS or (code == grpc.StatusCode.UNAVAILABLE
                                              and no_worker), (code, details)
    if code != OK:
        assert details, "every refusal says why"
        assert unchanged(before, fuzzed.dump()), f"{method} refused ({code}): index changed"
    if len(payload) > LIMITS.max_message_bytes:
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED  # by the transport, as it arrives


def test_the_service_survived_and_still_routes(fuzzed: Fuzzed) -> None:
    assert fuzzed.proc.alive
    health = health_pb2_grpc.HealthStub(fuzzed.channel).Check(health_pb2.HealthCheckRequest())
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    fuzzed.keep_alive()
    res = fuzzed.stub.Route(pb.RouteRequest(token_ids=list(range(9)), model="tiny",
                                            dry_run=True))
    assert res.candidates and not res.degraded
