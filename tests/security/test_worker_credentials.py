"""Worker credentials are per worker, against real processes: what a router presents to a worker is
valid on
that worker only, and nothing a worker receives lets it call another worker.

The attack (``../shared/repro/security/01_hostile_worker_cross_tenant_oracle.py``): a worker
that turned hostile (or a fake one registered with its own bound token) collects the
``authorization`` of a routed request and the tenant's salt, then calls ``Generate`` on
another worker under that salt and reads ``num_cached_tokens`` (vLLM CVE-2025-46570's
oracle). With one access token valid on every worker that call succeeded.

(a) two worker processes, one given its own credential as an operator would
    (``kvmesh worker-access-token`` -> ``KVMESH_WORKER_ACCESS_TOKEN``), one given the router
    token and no ``--worker-id`` (it derives its own once its port names it): each refuses
    the other's credential and the router token, and accepts its own;
(b) a cluster started as ``kvmesh up --token`` does, plus a hostile worker with its own bound
    token that the index routes a tenant's request to: replaying what it received (the
    authorization and the salt) on the real worker is refused, as is every secret the
    launcher handed the real worker, tried on the other one.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import grpc
import pytest
from typer.testing import CliRunner

from client.cli import app
from deploy.local import ClusterSpec, LocalCluster
from deploy.process import ServerProcess
from kvmesh.hashing import block_hashes, none_hash, resolve_seed
from kvmesh.rpc.auth import worker_access_token
from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc, worker_pb2, worker_pb2_grpc
from service.worker_tokens import mint
from tests.client.fake_servers import FakeWorker, heartbeating, start_server

pytestmark = pytest.mark.integration  # real worker, service and Valkey processes

ROUTER = "router-token-of-issue-22"
BS, ALGO = 4, "sha256_cbor"
REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def generate_code(address: str, metadata: tuple, salt: str = "") -> grpc.StatusCode:
    """The status of one Generate (a 9-token prompt, 1 new token) at ``address``."""
    req = worker_pb2.GenerateRequest(request_id="probe", token_ids=list(range(1, 10)),
                                     salt=salt, sampling=worker_pb2.SamplingParams(
                                         max_tokens=1, ignore_eos=True))
    with grpc.insecure_channel(address) as ch:
        try:
            list(worker_pb2_grpc.WorkerServiceStub(ch).Generate(req, metadata=metadata,
                                                                timeout=60))
            return grpc.StatusCode.OK
        except grpc.RpcError as err:
            return err.code()


def stats_code(address: str, metadata: tuple) -> grpc.StatusCode:
    with grpc.insecure_channel(address) as ch:
        try:
            worker_pb2_grpc.WorkerServiceStub(ch).Stats(worker_pb2.WorkerStatsRequest(),
                                                        metadata=metadata, timeout=30)
            return grpc.StatusCode.OK
        except grpc.RpcError as err:
            return err.code()


def worker_process(name: str, args: list[str], env: dict[str, str]) -> ServerProcess:
    base = {"OMP_NUM_THREADS": "1", "KVMESH_TOKEN": "", "KVMESH_WORKER_ACCESS_TOKEN": "",
            "KVMESH_WORKER_TOKEN": "", "KVMESH_WORKER_SECRET": ""}
    return ServerProcess(name, "worker", ["--host", "127.0.0.1", "--port", "0",
                                          "--block-size", str(BS), "--num-blocks", "64",
                                          *args], env={**base, **env})


def test_one_workers_credential_is_refused_by_another() -> None:
    out = CliRunner().invoke(app, ["worker-access-token", "--worker-id", "gpu-a"],
                             env={"KVMESH_TOKEN": ROUTER})
    assert out.exit_code == 0, out.output
    minted = out.output.strip()
    assert minted == worker_access_token(ROUTER, "gpu-a")
    a = worker_process("gpu-a", ["--worker-id", "gpu-a"],
                       {"KVMESH_WORKER_ACCESS_TOKEN": minted})
    b = worker_process("b", [], {"KVMESH_TOKEN": ROUTER})  # id: <hostname>-<port>
    try:
        a.start(120)
        b.start(120)
        assert a.address and b.address
        b_id = f"{socket.gethostname()}-{b.address.rpartition(':')[2]}"
        a_cred, b_cred = bearer(minted), bearer(worker_access_token(ROUTER, b_id))
        for own, other, target in ((a_cred, b_cred, a.address), (b_cred, a_cred, b.address)):
            assert generate_code(target, other) in REFUSED
            assert stats_code(target, other) in REFUSED
            assert generate_code(target, bearer(ROUTER)) in REFUSED  # never the router token
            assert generate_code(target, ()) in REFUSED
            assert generate_code(target, own) == grpc.StatusCode.OK
            assert stats_code(target, own) == grpc.StatusCode.OK
    finally:
        for p in (a, b):
            p.terminate()
            p.wait(15)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the worker processes: one torch thread
    spec = ClusterSpec(workers=2, num_blocks=64, block_size=BS, token=ROUTER)
    with LocalCluster(spec) as c:
        yield c


def test_a_hostile_worker_cannot_replay_what_it_was_routed(cluster: LocalCluster) -> None:
    real = {w.name: w.address for w in cluster.workers}
    # the hostile worker: its own bound token (all a worker holds), an address it serves
    rogue = FakeWorker("gpu-9")
    server, rogue_address = start_server(rogue, worker_pb2_grpc.add_WorkerServiceServicer_to_server)
    prompt, salt = list(range(40, 80)), "acme-tenant-salt"
    try:
        md = bearer(mint(cluster.spec.worker_secret, "gpu-9"))
        with grpc.insecure_channel(cluster.service_addresses[0]) as ch:
            stub = index_pb2_grpc.IndexServiceStub(ch)
            stub.RegisterWorker(pb.RegisterWorkerRequest(
                worker_id="gpu-9", address=rogue_address, model="tiny", block_size=BS,
                hash_algo=ALGO, root_hash=none_hash(ALGO, resolve_seed(ALGO, None)),
                incarnation=99, load=pb.WorkerLoad(free_blocks=64, total_blocks=64)),
                metadata=md, timeout=10)
            # it claims the tenant's prompt, so the index routes that prompt to it (pinned
            # too: a route answered degraded under load ranks by load alone)
            with heartbeating(stub, "gpu-9", 99, md):
                stored = pb.KvEvent(seq=1, stored=pb.BlockStored(
                    block_hashes=block_hashes(prompt, BS, salt=salt), tier=pb.TIER_GPU))
                stub.PublishEvents(pb.PublishEventsRequest(
                    worker_id="gpu-9", incarnation=99, events=[stored]), metadata=md, timeout=10)
                with cluster.client() as client:
                    res = client.generate(prompt, max_tokens=1, salt=salt, worker_id="gpu-9")
        assert res.worker_id == "gpu-9" and rogue.requests
        captured = rogue.metadata[-1]["authorization"]
        assert captured == f"Bearer {worker_access_token(ROUTER, 'gpu-9')}"
        stolen_salt = rogue.requests[-1].salt
        assert stolen_salt  # the tenant's salt does reach the worker the prompt is routed to
        replay = (("authorization", captured),)
        for address in real.values():  # ... and opens no other worker
            assert generate_code(address, replay, stolen_salt) in REFUSED
            assert stats_code(address, replay) in REFUSED
    finally:
        server.stop(0)
    # nothing the launcher handed worker-0 calls worker-1
    given = [v for v in cluster.workers[0].env.values() if v and len(v) >= 16]
    assert cluster.workers[0].env["KVMESH_WORKER_ACCESS_TOKEN"] in given
    for secret in given:
        assert generate_code(real["worker-1"], bearer(secret)) in REFUSED
    assert generate_code(real["worker-0"], bearer(
        cluster.workers[0].env["KVMESH_WORKER_ACCESS_TOKEN"])) == grpc.StatusCode.OK
