"""Taking over a live worker id, performed against real processes: a Valkey, a service and a worker
started by ``LocalCluster`` (as ``kvmesh up --token`` does, plus a shared worker token that
the attacker also holds), and an attacker's own gRPC worker server.

(a) the router token, which every gateway holds, is no worker credential: a service with
    only a router token refuses to start, and Register/Heartbeat/Publish/Sync with it are
    refused;
(b) a valid worker credential cannot take over the live worker's id from another address:
    refused, its record unchanged, routing still reaches the real worker;
(c) heartbeats and publishes for that id carrying any incarnation but the registered one
    are refused, so the refused attacker cannot feed the record either;
(d) a fake worker that the index legitimately names (its own id, the best match) receives
    no router token from a client: only its own access token (derived from it and "fake").
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from deploy.local import ClusterSpec, LocalCluster
from kvmesh.hashing import block_hashes, none_hash, resolve_seed
from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc as pb_grpc
from kvmesh.v1 import worker_pb2_grpc
from service.index.redis import REGISTRY, worker_key
from tests.client.fake_servers import FakeWorker, heartbeating, start_server

pytestmark = pytest.mark.integration  # real service, worker and Valkey processes

ROUTER, SHARED = "router-secret-token", "shared-worker-token"
ROOT = Path(__file__).resolve().parents[2]
BS, ALGO = 16, "sha256_cbor"


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the worker process: one torch thread
    spec = ClusterSpec(workers=1, num_blocks=64, block_size=BS, token=ROUTER,
                       worker_token=SHARED)
    with LocalCluster(spec) as c:
        yield c


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def code_of(call, *args, **kw) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    try:
        call(*args, **kw)
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()


def register(worker_id: str, address: str, incarnation: int,
             **load: int) -> pb.RegisterWorkerRequest:
    return pb.RegisterWorkerRequest(
        worker_id=worker_id, address=address, model="tiny", block_size=BS, hash_algo=ALGO,
        root_hash=none_hash(ALGO, resolve_seed(ALGO, None)), incarnation=incarnation,
        load=pb.WorkerLoad(**load))


def snapshot(db, worker_id: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The worker's record minus the fields its own heartbeats keep changing."""
    rec = db.hgetall(worker_key(db.hget(REGISTRY, worker_id), worker_id))
    return {k: v for k, v in rec.items() if k in ("address", "inc", "reg", "cred", "seq")}


def test_a_service_with_only_a_router_token_refuses_to_start(redis_url: str) -> None:
    env = {**os.environ, "KVMESH_TOKEN": ROUTER, "KVMESH_WORKER_TOKEN": "",
           "KVMESH_WORKER_SECRET": "", "PYTHONPATH": str(ROOT), "COLUMNS": "400"}
    proc = subprocess.run(
        [sys.executable, "-m", "service", "--port", "0", "--redis-url", redis_url],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0, proc.stdout
    assert "--worker-secret" in proc.stderr and "never accepted on worker calls" in proc.stderr


def test_kvmesh_up_with_a_router_token_accepts_no_worker_call_with_it() -> None:
    """The issue's setup: ``kvmesh up --token T`` and nothing else (the launcher gives the
    service a worker secret of its own); T registers nothing."""
    import redis

    with LocalCluster(ClusterSpec(workers=0, token=ROUTER)) as bare, \
            grpc.insecure_channel(bare.service_addresses[0]) as ch:
        stub = pb_grpc.IndexServiceStub(ch)
        assert code_of(stub.RegisterWorker, register("intruder", "127.0.0.1:1", 7),
                       metadata=bearer(ROUTER)) == grpc.StatusCode.UNAUTHENTICATED
        assert code_of(stub.Heartbeat, pb.HeartbeatRequest(worker_id="intruder", incarnation=7),
                       metadata=bearer(ROUTER)) == grpc.StatusCode.UNAUTHENTICATED
        db = redis.Redis.from_url(bare.redis_url, decode_responses=True)
        assert db.hget(REGISTRY, "intruder") is None


def test_the_router_token_is_no_worker_credential(cluster: LocalCluster) -> None:
    import redis

    db = redis.Redis.from_url(cluster.redis_url, decode_responses=True)
    before = snapshot(db, "worker-0")
    unauth = grpc.StatusCode.UNAUTHENTICATED
    with grpc.insecure_channel(cluster.service_addresses[0]) as ch:
        stub = pb_grpc.IndexServiceStub(ch)
        md = bearer(ROUTER)
        for wid in ("worker-0", "intruder"):
            assert code_of(stub.RegisterWorker, register(wid, "127.0.0.1:1", 7),
                           metadata=md) == unauth
            assert code_of(stub.Heartbeat, pb.HeartbeatRequest(
                worker_id=wid, incarnation=int(before["inc"])), metadata=md) == unauth
            assert code_of(stub.PublishEvents, pb.PublishEventsRequest(
                worker_id=wid, incarnation=int(before["inc"]), events=[pb.KvEvent(
                    seq=int(before["seq"]) + 1, cleared=pb.AllBlocksCleared())]),
                metadata=md) == unauth
            assert code_of(stub.SyncWorker, pb.SyncWorkerRequest(
                worker_id=wid, incarnation=int(before["inc"])), metadata=md) == unauth
    assert db.hget(REGISTRY, "intruder") is None
    assert snapshot(db, "worker-0") == before


def test_a_live_worker_id_cannot_be_taken_over(cluster: LocalCluster) -> None:
    import redis

    db = redis.Redis.from_url(cluster.redis_url, decode_responses=True)
    real = cluster.workers[0].address
    before = snapshot(db, "worker-0")
    fake = FakeWorker("worker-0")
    server, fake_address = start_server(fake, worker_pb2_grpc.add_WorkerServiceServicer_to_server)
    try:
        with grpc.insecure_channel(cluster.service_addresses[0]) as ch, cluster.client() as client:
            stub = pb_grpc.IndexServiceStub(ch)
            taken = code_of(stub.RegisterWorker, register("worker-0", fake_address, 666,
                                                          free_blocks=64, total_blocks=64),
                            metadata=bearer(SHARED))
            assert taken == grpc.StatusCode.ALREADY_EXISTS
            assert snapshot(db, "worker-0") == before
            # (c) the attacker's incarnation (or none) feeds nothing into the record
            tokens = [(5 * i) % 200 + 1 for i in range(40)]
            stored = pb.KvEvent(seq=int(before["seq"]) + 1, stored=pb.BlockStored(
                block_hashes=block_hashes(tokens, BS), tier=pb.TIER_GPU))
            for inc in (666, 0):
                assert code_of(stub.Heartbeat, pb.HeartbeatRequest(
                    worker_id="worker-0", incarnation=inc, load=pb.WorkerLoad(total_blocks=1)),
                    metadata=bearer(SHARED)) == grpc.StatusCode.FAILED_PRECONDITION
                assert code_of(stub.PublishEvents, pb.PublishEventsRequest(
                    worker_id="worker-0", incarnation=inc, events=[stored]),
                    metadata=bearer(SHARED)) == grpc.StatusCode.FAILED_PRECONDITION
            assert snapshot(db, "worker-0") == before
            assert client.route(tokens, dry_run=True).candidates[0].matched_tokens == 0
            res = client.generate(tokens, max_tokens=2)
            assert (res.worker_id, res.address) == ("worker-0", real)
            assert fake.requests == []
    finally:
        server.stop(0)


def test_a_fake_worker_never_receives_the_router_token(cluster: LocalCluster) -> None:
    fake = FakeWorker("fake")
    server, fake_address = start_server(fake, worker_pb2_grpc.add_WorkerServiceServicer_to_server)
    tokens = [(3 * i) % 200 + 1 for i in range(64)]
    try:
        with grpc.insecure_channel(cluster.service_addresses[0]) as ch, cluster.client() as client:
            stub = pb_grpc.IndexServiceStub(ch)
            stub.RegisterWorker(register("fake", fake_address, 99, free_blocks=64,
                                         total_blocks=64), metadata=bearer(SHARED))
            # heartbeats from its registration on: CI once routed to worker-0, the fake dead
            with heartbeating(stub, "fake", 99, bearer(SHARED)):
                # it claims the prompt; the request is also pinned to it (worker_id): a
                # route answered degraded (a Redis call past the service's 0.5 s timeout on
                # a loaded host) ranks by load alone and once picked worker-0 in CI
                stored = pb.KvEvent(seq=1, stored=pb.BlockStored(
                    block_hashes=block_hashes(tokens, BS), tier=pb.TIER_GPU))
                stub.PublishEvents(pb.PublishEventsRequest(
                    worker_id="fake", incarnation=99, events=[stored]), metadata=bearer(SHARED))
                res = client.generate(tokens, max_tokens=2, worker_id="fake")
                client.worker_stats(fake_address)  # its id looked up at the service
                alive = {w["worker_id"]: w["alive"] for w in client.stats()["workers"]}
        assert res.worker_id == "fake" and len(fake.metadata) == 2, alive
        for md in fake.metadata:
            assert all(ROUTER not in str(v) for v in md.values()), md
        from kvmesh.rpc.auth import worker_access_token

        assert {md["authorization"] for md in fake.metadata} \
            == {f"Bearer {worker_access_token(ROUTER, 'fake')}"}
    finally:
        server.stop(0)


def test_a_worker_restarted_on_another_port_comes_back(cluster: LocalCluster) -> None:
    """The takeover guard must not lock out the id's rightful owner: killed and restarted on
    a new port, the worker is refused while its old record lives, then registers."""
    from deploy.waiting import wait_until

    old = cluster.workers[0]
    old.kill()                                                            # kill -9
    new = cluster.add_worker("worker-0")
    assert new.address != old.address
    with cluster.client() as client:
        wait_until(lambda: [(w["address"], w["alive"]) for w in client.stats()["workers"]
                            if w["worker_id"] == "worker-0"] == [(new.address, True)],
                   timeout=30)
        res = client.generate([(7 * i) % 200 + 1 for i in range(40)], max_tokens=2)
    assert (res.worker_id, res.address) == ("worker-0", new.address)
