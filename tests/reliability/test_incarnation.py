"""Worker incarnations (a stale one is refused) and retried publishes (idempotent) through the
service's RPCs, on both backends, and a real worker process killed and restarted under the
same id while a delayed batch of its dead predecessor arrives."""
from __future__ import annotations

import asyncio

import grpc
import pytest

from kvmesh.hashing import block_hashes
from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc as pb_grpc
from service.config import ServiceConfig
from tests.grpc_codes import code_of
from tests.service.protocol_worker import ProtocolWorker, prompt, route, serve

FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION


@pytest.fixture(params=["memory", "redis"])
def config(request: pytest.FixtureRequest) -> ServiceConfig:
    if request.param == "memory":
        return ServiceConfig(backend="memory")
    return ServiceConfig(backend="redis", redis_url=request.getfixturevalue("redis_url"))




def test_calls_of_a_replaced_incarnation_are_refused(config: ServiceConfig) -> None:
    async def main() -> None:
        async with serve(config) as r:
            old = ProtocolWorker(r.stub, "a", incarnation=2**64 - 1)
            await old.join()
            await old.store(prompt(12))
            new = ProtocolWorker(r.stub, "a", incarnation=2**64 - 2)  # restarted: seqs from 1
            await new.join()
            p = prompt(12, start=100)
            stale = pb.KvEvent(seq=1, stored=pb.BlockStored(block_hashes=old.hashes(p)))
            for call in (old.publish(stale), old.heartbeat(), old.sync()):
                assert await code_of(call) == FAILED_PRECONDITION
            assert (await route(r.stub, p)).candidates[0].matched_tokens == 0
            assert (await route(r.stub, prompt(12))).candidates[0].matched_tokens == 0
            assert not (await new.heartbeat()).resync
            await new.store(p)
            assert (await route(r.stub, p)).candidates[0].matched_tokens == 8

    asyncio.run(main())


def test_a_retried_overlapping_publish_needs_no_resync(config: ServiceConfig) -> None:
    async def main() -> None:
        async with serve(config) as r:
            a = ProtocolWorker(r.stub, "a", incarnation=7)
            await a.join()
            p1, p2 = prompt(12), prompt(12, start=50)
            e1 = a.next_event(stored=pb.BlockStored(block_hashes=a.hashes(p1)))
            assert (await a.publish(e1)).applied == 1   # applied; pretend the answer was lost
            e2 = a.next_event(stored=pb.BlockStored(block_hashes=a.hashes(p2)))
            res = await a.publish(e1, e2)               # the retry, with a new event
            assert (res.resync, res.applied, res.last_seq) == (False, 1, 2)
            assert not (await a.heartbeat()).resync
            for p in (p1, p2):
                assert (await route(r.stub, p)).candidates[0].matched_tokens == 8
            gap = a.next_event(cleared=pb.AllBlocksCleared())
            gap.seq += 1
            assert (await a.publish(gap)).resync         # a real gap still asks for a snapshot

    asyncio.run(main())


@pytest.mark.integration
def test_a_stale_batch_of_a_killed_worker_never_reaches_its_successor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Real Valkey, service and worker processes (worker tokens bound to ids): kill -9 the
    worker, restart it with the same id and port, deliver a batch of the dead process (its
    incarnation and token, seqs the new record expects next), and check the index holds
    exactly what the new process holds."""
    import redis

    from deploy.local import ClusterSpec, LocalCluster
    from deploy.waiting import wait_until
    from service.index.redis import REGISTRY, worker_key
    from service.index.redis.keys import block_key, entries

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the worker processes: one torch thread
    spec = ClusterSpec(workers=1, num_blocks=64, block_size=16,
                       worker_secret="incarnation-test-secret")
    with LocalCluster(spec) as cluster, cluster.client() as client:
        db = redis.Redis.from_url(cluster.redis_url, decode_responses=True)
        ns = db.hget(REGISTRY, "worker-0")
        record = worker_key(ns, "worker-0")

        def indexed() -> int:  # the blocks the index holds for the worker
            return int(db.hget(record, "n") or 0)
        old_proc = cluster.workers[0]
        x = [(7 * i) % 200 + 1 for i in range(40)]
        client.generate(x, max_tokens=4)

        def whole() -> bool:
            held = client.worker_stats(old_proc.address)["cache"]["cached_hashes"]
            return held > 0 and indexed() == held

        wait_until(whole, timeout=15)
        old_inc = int(db.hget(record, "inc"))
        assert old_inc != 0
        port = int(old_proc.address.rpartition(":")[2])
        old_proc.kill()                                                   # kill -9
        new_proc = cluster.add_worker("worker-0", port=port)
        assert new_proc.address == old_proc.address
        old_reg = db.hget(record, "reg")
        wait_until(lambda: db.hget(record, "reg") not in (None, old_reg), timeout=30)
        wait_until(lambda: client.stats()["workers"][0]["alive"], timeout=10)
        assert indexed() == 0 == client.worker_stats(new_proc.address)["cache"][
            "cached_hashes"]
        assert db.hget(record, "inc") != str(old_inc)

        # the dead process's delayed batch: exactly what the new record would take next
        stale = pb.PublishEventsRequest(worker_id="worker-0", incarnation=old_inc, events=[
            pb.KvEvent(seq=int(db.hget(record, "seq")) + 1, stored=pb.BlockStored(
                block_hashes=block_hashes(x, 16), tier=pb.TIER_GPU))])
        token = (("authorization", f"Bearer {cluster.service_token('worker-0')}"),)
        with grpc.insecure_channel(cluster.service_addresses[0]) as ch:
            with pytest.raises(grpc.RpcError) as err:
                pb_grpc.IndexServiceStub(ch).PublishEvents(stale, metadata=token, timeout=5)
        assert err.value.code() == FAILED_PRECONDITION, err.value
        assert "stale incarnation" in err.value.details()
        assert indexed() == 0                     # exactly what the new process holds
        assert client.route(x, dry_run=True).candidates[0].matched_tokens == 0

        # and the new process goes on being indexed exactly
        y = [(11 * i) % 200 + 1 for i in range(40)]
        client.generate(y, max_tokens=4)
        wait_until(lambda: indexed() == client.worker_stats(new_proc.address)[
            "cache"]["cached_hashes"] > 0, timeout=15)
        raw, handle = redis.Redis.from_url(cluster.redis_url), int(db.hget(record, "h"))

        def holds(h: bytes) -> bool:
            return handle in entries(raw.get(block_key(h)))

        assert all(holds(h) for h in block_hashes(y, 16))
        assert not any(holds(h) for h in block_hashes(x, 16))
