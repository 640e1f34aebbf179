"""Workers' event lanes on a real 3-primary Redis Cluster (``service/index/lanes.py``): an
event batch touches no control key; draws and their lane resets raced, lost or reordered;
a lost lane; a replica whose generation is old."""
from __future__ import annotations

import pytest
from redis.asyncio.cluster import RedisCluster

from deploy.redis_cluster import RedisClusterServer
from service.index import lanes, nodes
from service.index.base import (
    ApplyStatus,
    BlockCap,
    BlockMatch,
    IndexEvent,
    IndexRemoved,
    IndexStored,
    WorkerLoad,
)
from service.index.cluster import CTL_SLOT, ClusterBackend
from service.index.redis import RedisBackend, keys
from tests.reliability.test_index_cluster_split import _spread_chain, run
from tests.service.index.test_base import NS, T0, H, rec

pytestmark = [pytest.mark.integration, pytest.mark.cluster_layout]


def test_an_event_batch_touches_no_control_key(redis_cluster: RedisClusterServer,
                                               redis_cluster_url: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    chain = _spread_chain(redis_cluster)

    async def body(b: ClusterBackend) -> None:
        await b.register(rec("w"))
        await b.apply_events("w", [IndexEvent(1, IndexStored(tuple(chain[:4])))])
        slots: list[int] = []
        by_redis_py: list[tuple] = []
        on_slots, execute = nodes.on_slots, RedisCluster.execute_command

        async def spy_slots(client, batch, retry=False):
            slots.extend(s for s, _ in batch)
            return await on_slots(client, batch, retry)

        async def spy_execute(self, *args, **kw):
            by_redis_py.append(args)
            return await execute(self, *args, **kw)

        monkeypatch.setattr(nodes, "on_slots", spy_slots)
        monkeypatch.setattr(RedisCluster, "execute_command", spy_execute)
        res = await b.apply_events("w", [IndexEvent(2, IndexStored(tuple(chain[4:]),
                                                                   parent=chain[3])),
                                         IndexEvent(3, IndexRemoved(tuple(chain[20:])))])
        monkeypatch.undo()
        assert res.status is ApplyStatus.OK and res.last_seq == 3
        assert slots and CTL_SLOT not in slots and not by_redis_py
        assert await b.lookup(NS, chain, T0) == {"w": BlockMatch(20, 20)}

    run(redis_cluster_url, body)


def test_lane_resets_land_in_draw_order(redis_cluster_url: str) -> None:
    chain = H(11, 1, 2)

    async def body(b: ClusterBackend) -> None:
        c = b.client
        await b.register(rec("w"))
        d1 = await lanes.draw(b, NS, "w", 0, BlockCap())
        d2 = await lanes.draw(b, NS, "w", 0, BlockCap())
        assert await lanes.reset(b, NS, "w", 0, d2, 0, gen=d2.gen)
        assert not await lanes.reset(b, NS, "w", 0, d1, 0, gen=d1.gen)  # older: no change
        assert int(await c.hget(keys.lane_key(NS, "w"), "h")) == d2.handle
        assert int(await c.hget(keys.worker_key(NS, "w"), "h")) == d2.handle
        await b.apply_events("w", [IndexEvent(1, IndexStored(tuple(chain)))])
        assert await b.lookup(NS, chain, T0) == {"w": BlockMatch(3, 3)}
        assert (await b.heartbeat("w", WorkerLoad(), 1, T0)).last_seq == 1

    run(redis_cluster_url, body)


def test_a_draw_whose_reset_was_lost_is_answered_by_a_snapshot(redis_cluster_url: str) -> None:
    """The service died between a handle's draw and the lane's reset: the lane still names
    the retired handle, whose entries no reader sees; the heartbeat asks for a snapshot."""
    chain = H(12, 1, 2, 3)

    async def body(b: ClusterBackend) -> None:
        await b.register(rec("w"))
        await b.apply_events("w", [IndexEvent(1, IndexStored(tuple(chain)))])
        d = await lanes.draw(b, NS, "w", 0, BlockCap())  # ... and no reset
        assert d.status == 1
        assert await b.lookup(NS, chain, T0) == {}  # the lane's handle is retired
        await b.apply_events("w", [IndexEvent(2, IndexStored(tuple(H(13, 1))))])
        assert await b.lookup(NS, H(13, 1), T0) == {}
        assert (await b.heartbeat("w", WorkerLoad(), 2, T0)).last_seq == -1
        assert await b.sync_worker("w", 2, [IndexStored(tuple(chain))]) == 4
        assert (await b.heartbeat("w", WorkerLoad(), 2, T0)).last_seq == 2
        assert await b.lookup(NS, chain, T0) == {"w": BlockMatch(4, 4)}

    run(redis_cluster_url, body)


def test_a_lost_lane_is_a_gap_and_a_snapshot_rebuilds_it(redis_cluster_url: str) -> None:
    chain = H(14, 1, 2)

    async def body(b: ClusterBackend) -> None:
        await b.register(rec("w"))
        await b.apply_events("w", [IndexEvent(1, IndexStored(tuple(chain[:2])))])
        await b.client.delete(keys.lane_key(NS, "w"))  # its shard came back empty
        gap = await b.apply_events("w", [IndexEvent(2, IndexStored(tuple(chain[2:]),
                                                                   parent=chain[1]))])
        assert gap.status is ApplyStatus.GAP
        assert (await b.heartbeat("w", WorkerLoad(), 2, T0)).last_seq == -1
        unknown = await b.apply_events("nobody", [IndexEvent(1, IndexStored(tuple(chain)))])
        assert unknown.status is ApplyStatus.UNKNOWN_WORKER
        assert await b.sync_worker("w", 2, [IndexStored(tuple(chain))]) == 3
        ok = await b.apply_events("w", [IndexEvent(3, IndexRemoved(tuple(chain[2:])))])
        assert ok.status is ApplyStatus.OK and ok.last_seq == 3
        assert await b.lookup(NS, chain, T0) == {"w": BlockMatch(2, 2)}
        assert (await b.get_worker("w")).last_seq == 3

    run(redis_cluster_url, body)


def test_a_replica_with_an_old_generation_reads_it_again(redis_cluster_url: str) -> None:
    chain = H(15, 1, 2)

    async def body(a: ClusterBackend) -> None:
        b = RedisBackend.from_url(redis_cluster_url)
        assert isinstance(b, ClusterBackend)
        try:
            await a.register(rec("w"))
            await b.apply_events("w", [IndexEvent(1, IndexStored(tuple(chain[:1])))])
            old = b.gen
            await a.client.set(lanes.GEN, "moved")  # a shard was lost: everyone resyncs
            assert (await a.heartbeat("w", WorkerLoad(), 1, T0)).last_seq == -1
            assert await a.sync_worker("w", 1, [IndexStored(tuple(chain[:1]))]) == 1
            # b still holds the old generation: it reads it again, no needless resync
            assert b.gen == old
            ok = await b.apply_events("w", [IndexEvent(2, IndexStored(tuple(chain[1:]),
                                                                      parent=chain[0]))])
            assert ok.status is ApplyStatus.OK and b.gen == b"moved"
            # the generation moves again; a lane of the old one is a gap once read
            await a.client.set(lanes.GEN, "again")
            assert (await b.heartbeat("w", WorkerLoad(), 2, T0)).last_seq == -1
            gap = await b.apply_events("w", [IndexEvent(3, IndexRemoved(tuple(chain[2:])))])
            assert gap.status is ApplyStatus.GAP and gap.last_seq == 2
            assert await b.lookup(NS, chain, T0) == {"w": BlockMatch(3, 3)}
        finally:
            await b.close()

    run(redis_cluster_url, body)
