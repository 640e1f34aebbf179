"""The worker's index link: its outbox is bounded while the service is
unreachable, a backlog larger than the service's batch limit is split, a single event the
service refuses is replaced by a snapshot, and heartbeats never wait on any of it.

Real parts in one process: the service over the session's Valkey, a tiny engine and the link.
"""
from __future__ import annotations

import asyncio
import contextlib

import pytest

from client import AsyncKvmeshClient
from deploy.waiting import eventually
from kvmesh.events.pool import PoolRemoved, PoolStored
from kvmesh.hashing import none_hash
from service.config import ServiceConfig
from service.server import create_server as create_service
from tests.ports import free_port
from worker import Engine
from worker.engine.async_engine import AsyncEngine
from worker.index_link import ServiceLink
from worker.outbox import Outbox


def prompts(r: int, n: int = 50) -> list[list[int]]:
    """``n`` distinct 9-token prompts of round ``r``: two full blocks of 4, no sharing."""
    return [[r, i, 5, 6, 7, 8, 9, 10, 11] for i in range(n)]


@contextlib.asynccontextmanager
async def service_at(port: int, **cfg):
    server, _ = await create_service(f"127.0.0.1:{port}", ServiceConfig(**cfg))
    await server.start()
    try:
        yield
    finally:
        await server.stop(None)


@contextlib.asynccontextmanager
async def linked_engine(port: int, **link_opts):
    runner = AsyncEngine(Engine.from_pretrained("tiny", block_size=4, num_blocks=4096)).start()
    link = ServiceLink([f"127.0.0.1:{port}"], runner, worker_id="w0", address="127.0.0.1:1",
                       model="tiny", root_hash=none_hash("sha256_cbor"), heartbeat_s=0.2,
                       **link_opts)
    task = asyncio.create_task(link.run())
    try:
        yield runner, link
    finally:
        await link.close()
        task.cancel()
        runner.stop()


async def run_round(runner: AsyncEngine, batch: list[list[int]]) -> None:
    """Run ``batch`` on the engine thread in one go (the link collects its events at once,
    after it), then wait until the link has received them."""
    await runner.call(lambda e: e.generate(batch, max_tokens=1))
    await runner.call(lambda e: None)  # the collect after the batch was posted before this


async def worker_row(client: AsyncKvmeshClient) -> dict:
    st = await client.stats()
    return st["workers"][0] if st["workers"] else {}


def exact(row: dict, engine: Engine) -> bool:
    """The index holds what the engine holds, as of its last event."""
    return (row.get("last_seq") == engine.kv.pool.last_seq
            and row.get("indexed_blocks") == engine.kv.stats.hashes_cached)


# --- the outbox on its own ---------------------------------------------------------------


def test_outbox_drops_its_backlog_past_the_bound():
    box = Outbox(max_blocks=10)
    assert box.add([PoolStored(1, [b"a"] * 3, None, [], "gpu")])  # weight 4
    assert box.add([PoolRemoved(2, [b"a"] * 3, "gpu")], after=0) and box.blocks == 8
    assert not box.add([PoolStored(3, [b"b"] * 2, None, [], "gpu")])  # 11 > 10
    assert len(box) == 0 and box.blocks == 0


def test_outbox_batches_within_limits_and_leaves_by_seq():
    box = Outbox()
    box.add([PoolStored(s, [b"h"] * n, None, [], "gpu") for s, n in ((1, 5), (2, 1), (3, 1))])
    assert [e.seq for e in box.batch(10, 6)] == [1, 2]
    assert [e.seq for e in box.batch(1, 100)] == [1]
    assert [e.seq for e in box.batch(10, 2)] == [1]  # one event is indivisible
    box.add([PoolStored(2, [b"h"], None, [], "gpu")], after=3)  # already covered: ignored
    box.drop_through(2)
    assert [e.seq for e in box.batch(10, 10)] == [3] and box.blocks == 2


# --- bounded while the service is unreachable ---------------------------------------------


def test_outbox_stays_bounded_while_the_service_is_down_and_resyncs_after(redis_url):
    port, bound = free_port(), 400

    async def main():
        cfg = {"backend": "redis", "redis_url": redis_url}
        async with linked_engine(port, max_pending_blocks=bound) as (runner, link), \
                AsyncKvmeshClient(f"127.0.0.1:{port}") as client:
            async with service_at(port, **cfg):
                await run_round(runner, prompts(0))
                await eventually(lambda: worker_row(client), lambda w: exact(w, runner.engine),
                                 within=15)
            # The service is gone: 1500 requests, ~4500 blocks' worth of events.
            for r in range(1, 31):
                await run_round(runner, prompts(r))
                assert link.outbox.blocks <= bound and link.pending <= bound
            assert link.counters["overflows"] >= 1 and link.counters["error_unavailable"] >= 1
            async with service_at(port, **cfg):
                row = await eventually(lambda: worker_row(client),
                                       lambda w: exact(w, runner.engine) and w["alive"], within=15)
                assert row["indexed_blocks"] == 31 * 50 * 2
                for p in (prompts(0)[0], prompts(17)[3], prompts(30)[49]):
                    assert (await client.route(p, dry_run=True)).matched_tokens == 8

    asyncio.run(main())


# --- heartbeats never wait on publishing ---------------------------------------------------


LIVE = {"heartbeat_interval_s": 0.1, "liveness_timeout_s": 0.4, "purge_after_s": 5.0}


@pytest.mark.parametrize("limit", [{"max_batch_events": 4}, {"max_batch_hashes": 3}],
                         ids=["events", "hashes"])
def test_a_backlog_over_the_batch_limit_is_indexed_and_the_worker_stays_live(
        redis_url, limit):
    """``max_batch_events=4``: a 60-event backlog is split. ``max_batch_hashes=3``: even one
    event (2 hashes, plus a 12-block prompt's 3 hashes a batch) can be over the limit; such
    an event is given up for a snapshot. Either way the index ends exact, the worker never
    leaves routing, and nothing else is lost."""
    port = free_port()

    async def main():
        async with service_at(port, backend="redis", redis_url=redis_url, **LIVE, **limit), \
                linked_engine(port) as (runner, link), \
                AsyncKvmeshClient(f"127.0.0.1:{port}") as client:
            await eventually(lambda: worker_row(client), lambda w: exact(w, runner.engine)
                             and link.counters["resyncs"] == 1, within=15)
            batch = prompts(0, 60) + [list(range(40, 80))]  # 60 events of 2 hashes, one of 10
            await run_round(runner, batch)
            beats = link.counters["heartbeats"]

            rows: list[dict] = []  # every look, checked below (eventually retries errors)

            async def live_row():
                rows.append(await worker_row(client))
                return rows[-1]

            await eventually(live_row, lambda w: exact(w, runner.engine), within=15)
            # Stay live well past the liveness timeout (at least 8 more heartbeats).
            await eventually(live_row, lambda w: link.counters["heartbeats"] >= beats + 8,
                             within=15)
            assert all(row["alive"] for row in rows), rows  # live all the way through
            assert link.counters["refused"] >= 1 and link.counters["gaps"] == 0
            # Splitting loses nothing (one resync, at registration); a lone event over the
            # hash limit costs exactly one more.
            assert link.counters["resyncs"] == (1 if "max_batch_events" in limit else 2)
            for p in batch[::7]:
                want = len(p) // 4 * 4
                assert (await client.route(p, dry_run=True)).matched_tokens == want

    asyncio.run(main())


def test_a_worker_whose_snapshot_is_refused_stays_live(redis_url):
    """A refusal that never ends (a snapshot over ``--max-snapshot-blocks``): the index
    cannot take the worker's blocks, but the worker keeps heartbeating and stays routable."""
    port = free_port()

    async def main():
        async with service_at(port, backend="redis", redis_url=redis_url, **LIVE,
                              max_snapshot_blocks=4), \
                linked_engine(port) as (runner, link), \
                AsyncKvmeshClient(f"127.0.0.1:{port}") as client:
            await run_round(runner, prompts(0, 10))  # 20 cached blocks: too big a snapshot
            await eventually(lambda: asyncio.sleep(0, link.counters),
                             lambda c: c["error_resource_exhausted"] >= 2, within=15)
            beats = link.counters["heartbeats"]

            rows: list[dict] = []  # every look, checked below (eventually retries errors)

            async def live_row():
                rows.append(await worker_row(client))
                return rows[-1]

            await eventually(live_row, lambda w: link.counters["heartbeats"] >= beats + 8,
                             within=15)
            assert all(row["alive"] for row in rows), rows
            assert link.counters["resyncs"] == 0

    asyncio.run(main())


def test_heartbeats_overlapping_publishes_ask_no_resync(redis_url):
    """With publishing and heartbeats in separate tasks, a heartbeat can carry a last_seq
    that an overlapping publish has already moved the index past; the service calls that
    "index ahead" and asks for a resync. Such answers are rechecked, never obeyed: a busy
    worker (a load change and new events after every request) never resyncs."""
    from worker.engine.sequence import SamplingParams

    port = free_port()

    async def main():
        async with service_at(port, backend="redis", redis_url=redis_url, **LIVE), \
                linked_engine(port) as (runner, link), \
                AsyncKvmeshClient(f"127.0.0.1:{port}") as client:
            await eventually(lambda: worker_row(client), lambda w: exact(w, runner.engine),
                             within=15)
            for r in range(300):
                async for _ in runner.generate([r % 250, 1, 2, 3, 4, 5, 6, 7, 8],
                                               SamplingParams(max_tokens=2), request_id=f"{r}"):
                    pass
            await eventually(lambda: worker_row(client), lambda w: exact(w, runner.engine),
                             within=15)
            assert link.counters["resyncs"] == 1 and link.counters["gaps"] == 0

    asyncio.run(main())


def test_quotas_set_on_the_service_reach_the_pool_change_and_clear(redis_url):
    """A quota set through the client reaches the engine's pool within a few seconds (the
    next heartbeat after the replica's refresh), a change reaches it again, and a clear
    returns it to no quotas."""
    from kvmesh.quota import Quota, Quotas

    async def main():
        port = free_port()
        cfg = dict(backend="redis", redis_url=redis_url, heartbeat_interval_s=0.2)
        async with service_at(port, **cfg), linked_engine(port) as (runner, link), \
                AsyncKvmeshClient(f"127.0.0.1:{port}") as client:
            kv = runner.engine.kv

            async def pool_quotas():
                return await runner.call(lambda e: e.kv.quotas)

            want = await client.set_tenant_quota("a", gpu=0.3, cpu=0.5)
            assert want == Quotas(tenants={"a": Quota(gpu=0.3, cpu=0.5)})
            await eventually(pool_quotas, lambda q: q == want, within=5)
            want = await client.set_tenant_quota("*", gpu=0.8)
            await eventually(pool_quotas, lambda q: q == want, within=5)
            assert link.quota_version == want.version
            await client.set_tenant_quota("a", clear=True)
            await client.set_tenant_quota("*", clear=True)
            await eventually(pool_quotas, lambda q: q == Quotas(), within=5)
            assert kv.quotas.version == 0 and link.counters["quota_updates"] >= 3

    asyncio.run(main())
