"""Pinning over real processes: Valkey, a service with router and admin tokens, two workers
started with their minted service tokens. The admin pins a prefix through the client and
the CLI; the service finds its holder in the index and calls that worker's Pin with the
pin token only it can derive; the pinned prefix survives pressure that evicts an unpinned
one; routers can pin neither through the service nor directly on a worker."""
from __future__ import annotations

import random

import grpc
import pytest
from typer.testing import CliRunner

from client import KvmeshError
from client.cli import app
from deploy.local import ClusterSpec, LocalCluster
from deploy.waiting import wait_until
from kvmesh.rpc.auth import worker_access_token
from kvmesh.v1 import worker_pb2, worker_pb2_grpc

ROUTER, ADMIN = "pin-router-token", "pin-admin-token"
BS = 16
PREFIX = [(7 * i) % 256 for i in range(3 * BS + 4)]  # 3 full blocks: a "system prompt"


@pytest.fixture(scope="module")
def cluster():
    # 40 blocks a worker: the pin cap (10%) is 4 blocks
    c = LocalCluster(ClusterSpec(workers=2, num_blocks=40, block_size=BS, token=ROUTER,
                                 extra_service_args=["--admin-token", ADMIN]))
    c.start(timeout=120)
    yield c
    c.stop()


def pinned(cluster: LocalCluster, client) -> dict[str, int]:
    return {w.name: client.worker_stats(w.address, w.name)["pinned_blocks"]
            for w in cluster.workers}


def cached(address: str, tokens: list[int], worker_id: str) -> int:
    """Prompt tokens a worker served from cache (generating directly, bypassing routing)."""
    access = (("authorization", f"Bearer {worker_access_token(ROUTER, worker_id)}"),)
    with grpc.insecure_channel(address) as ch:
        stub = worker_pb2_grpc.WorkerServiceStub(ch)
        req = worker_pb2.GenerateRequest(token_ids=tokens, sampling=worker_pb2.SamplingParams(
            max_tokens=1, ignore_eos=True))
        return list(stub.Generate(req, metadata=access))[-1].num_cached_tokens


def test_pin_holders_then_warm_then_survive_pressure_then_unpin(cluster: LocalCluster) -> None:
    with cluster.client(admin_token=ADMIN) as client:
        holder = client.generate(PREFIX + [1], max_tokens=1).worker_id
        wait_until(lambda: client.route(PREFIX + [2], dry_run=True).matched_tokens == 3 * BS,
                   timeout=10)
        other = next(w.name for w in cluster.workers if w.name != holder)
        res = client.pin(PREFIX, ttl_s=120)
        assert res.chain_blocks == 3 and not res.failed
        assert [(w.worker_id, w.pinned_blocks) for w in res.workers] == [(holder, 3)]
        assert pinned(cluster, client) == {holder: 3, other: 0}
        # two workers wanted, one holds it: the other is warmed, then pins it too
        res = client.pin(PREFIX, ttl_s=120, max_workers=2)
        assert sorted((w.worker_id, w.pinned_blocks) for w in res.workers) == sorted(
            [(holder, 3), (other, 3)]) and not res.failed
        assert pinned(cluster, client) == {holder: 3, other: 3}
        # pressure: far more other prompts than the pool holds, straight on the holder
        address = next(w.address for w in cluster.workers if w.name == holder)
        rng = random.Random(14)
        unpinned = [rng.randrange(256) for _ in range(3 * BS + 4)]
        cached(address, unpinned, holder)
        for _ in range(12):
            cached(address, [rng.randrange(256) for _ in range(4 * BS + 1)], holder)
        assert cached(address, PREFIX + [3], holder) == 3 * BS  # pinned: still on the device
        assert cached(address, unpinned, holder) == 0            # the same size, unpinned: gone
        res = client.unpin(PREFIX)
        assert sorted((w.worker_id, w.pinned_blocks) for w in res.workers) == sorted(
            [(holder, 3), (other, 3)])
        assert pinned(cluster, client) == {holder: 0, other: 0}


def test_routers_cannot_pin(cluster: LocalCluster) -> None:
    with cluster.client() as router:  # the router token only
        with pytest.raises(KvmeshError) as info:
            router.pin(PREFIX)
        assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
    for w in cluster.workers:  # nor straight on a worker with its access token
        access = (("authorization", f"Bearer {worker_access_token(ROUTER, w.name)}"),)
        with grpc.insecure_channel(w.address) as ch:
            with pytest.raises(grpc.RpcError) as err:
                worker_pb2_grpc.WorkerServiceStub(ch).Pin(
                    worker_pb2.PinRequest(token_ids=PREFIX, ttl_s=60), metadata=access)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_kvmesh_pin_command(cluster: LocalCluster) -> None:
    text = "You are a helpful assistant. Answer briefly and cite sources."  # 3 blocks + 14
    env = {"KVMESH_SERVICE": ",".join(cluster.service_addresses), "KVMESH_TOKEN": ROUTER,
           "KVMESH_ADMIN_TOKEN": ADMIN}
    runner = CliRunner()
    res = runner.invoke(app, ["pin", "--text", text, "--max-workers", "1", "--ttl", "60"],
                        env=env)
    assert res.exit_code == 0, res.output
    assert "pinned on 1 of 1 workers (prefix of 3 full blocks)" in res.stdout
    assert "3 blocks pinned" in res.stdout
    res = runner.invoke(app, ["pin", "--text", text, "--unpin"], env=env)
    assert res.exit_code == 0, res.output
    assert "unpinned on 2 of 2 workers" in res.stdout and "3 blocks unpinned" in res.stdout
