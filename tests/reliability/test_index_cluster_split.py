"""The per-slot split of the index on a real 3-primary Redis Cluster, attacked: a wave of
block writes cut midway, a block shard back empty, the control shard back empty (handles
counted from 1 again), the sweep racing a batch still writing a retired handle."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
import redis
import redis.exceptions as rexc

from deploy.redis_cluster import RedisClusterServer
from service.index import cluster as cluster_mod
from service.index import lanes
from service.index.base import (
    ApplyStatus,
    BlockMatch,
    IndexEvent,
    IndexStored,
    IndexUnavailable,
    WorkerLoad,
)
from service.index.cluster import CTL_SLOT, TAG_SLOTS, ClusterBackend
from service.index.redis import RedisBackend, keys
from tests.service.index.test_base import NS, T0, H, rec


def _node_of(cluster: RedisClusterServer, slot: int) -> int:
    return next(i for i, (a, z) in enumerate(cluster.ranges) if a <= slot <= z)


def _chain_on(cluster: RedisClusterServer, nodes: set[int], n: int, seed: int) -> list[bytes]:
    """A chain of ``n`` blocks whose every key lives on one of ``nodes``."""
    for s in range(seed, seed + 10_000):
        c = H(s, *range(n - 1))
        if all(_node_of(cluster, TAG_SLOTS[keys.tag(h)]) in nodes for h in c):
            return c
    raise AssertionError("no such chain")


def _spread_chain(cluster: RedisClusterServer, n: int = 24) -> list[bytes]:
    """A chain with blocks on every shard."""
    for s in range(1000):
        c = H(500 + s, *range(n - 1))
        if {_node_of(cluster, TAG_SLOTS[keys.tag(h)]) for h in c} == set(range(3)):
            return c
    raise AssertionError("no such chain")


def run(url: str, body: Callable[[ClusterBackend], Awaitable[None]]) -> None:
    async def main() -> None:
        b = RedisBackend.from_url(url)
        assert isinstance(b, ClusterBackend)
        try:
            await body(b)
        finally:
            await b.close()

    asyncio.run(main())


def test_a_wave_cut_midway_is_answered_by_a_resync(redis_cluster: RedisClusterServer,
                                                   redis_cluster_url: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    chain = _spread_chain(redis_cluster)

    async def body(b: ClusterBackend) -> None:
        await b.register(rec("w"))
        res = await b.apply_events("w", [IndexEvent(1, IndexStored(tuple(chain[:4])))])
        assert res.applied == 1
        real = ClusterBackend.wave_replies

        async def cut(self, batch, retry=False):  # the block writes: half land, then a fault
            if batch and cluster_mod.NODE_WRITE.sha in batch[0][1]:
                await real(self, batch[:len(batch) // 2], retry)
                raise rexc.ConnectionError("a shard went away")
            return await real(self, batch, retry)

        monkeypatch.setattr(ClusterBackend, "wave_replies", cut)
        with pytest.raises(IndexUnavailable):
            await b.apply_events("w", [IndexEvent(2, IndexStored(tuple(chain[4:]), chain[3]))])
        monkeypatch.setattr(ClusterBackend, "wave_replies", real)
        got = (await b.lookup(NS, chain, T0))["w"].blocks
        assert 4 <= got < len(chain)  # a chain cut short, never more than was held
        # the retried batch, and any later one, asks for a snapshot
        res = await b.apply_events("w", [IndexEvent(2, IndexStored(tuple(chain[4:]), chain[3]))])
        assert res.status is ApplyStatus.GAP
        assert (await b.apply_events("w", [IndexEvent(3, IndexStored((H(9)[0],)))])).status \
            is ApplyStatus.GAP
        assert await b.sync_worker("w", 2, [IndexStored(tuple(chain))]) == len(chain)
        assert await b.lookup(NS, chain, T0) == {"w": BlockMatch(len(chain), len(chain))}
        assert (await b.apply_events("w", [IndexEvent(3, IndexStored((H(9)[0],)))])).applied == 1
        (w,) = await b.workers(with_blocks=True)
        assert w.indexed_blocks == len(chain) + 1

    run(redis_cluster_url, body)


def test_a_shard_back_empty_makes_every_worker_resync(redis_cluster: RedisClusterServer,
                                                      redis_cluster_url: str) -> None:
    chain = _spread_chain(redis_cluster)
    victim = next(i for i in range(3) if i != _node_of(redis_cluster, CTL_SLOT))
    full = {"w": BlockMatch(len(chain), len(chain))}

    async def body(b: ClusterBackend) -> None:
        await b.register(rec("w"))
        assert (await b.apply_events("w", [IndexEvent(1, IndexStored(tuple(chain)))])).applied == 1
        await b.sweep()  # the janitor: shards checked, all there
        hb = await b.heartbeat("w", WorkerLoad(), 1, T0)
        assert hb.last_seq == 1 and await b.lookup(NS, chain, T0) == full
        redis_cluster.kill_node(victim)
        with pytest.raises(IndexUnavailable):  # the service answers degraded
            await b.lookup(NS, chain, T0)
        redis_cluster.restart_node(victim)  # back EMPTY
        assert (await b.lookup(NS, chain, T0))["w"].blocks < len(chain)
        await b.sweep()
        hb = await b.heartbeat("w", WorkerLoad(), 1, T0)
        assert hb.known and hb.last_seq < hb.prev_reported_seq  # the service asks a snapshot
        assert (await b.apply_events("w", [IndexEvent(2, IndexStored((H(9)[0],)))])).status \
            is ApplyStatus.GAP
        assert await b.sync_worker("w", 1, [IndexStored(tuple(chain))]) == len(chain)
        assert await b.lookup(NS, chain, T0) == full
        assert (await b.heartbeat("w", WorkerLoad(), 1, T0)).last_seq == 1
        await b.sweep()  # nothing lost any more: no new generation
        assert (await b.heartbeat("w", WorkerLoad(), 1, T0)).last_seq == 1

    run(redis_cluster_url, body)


def test_a_lost_control_shard_never_lends_old_entries_to_new_handles(
        redis_cluster: RedisClusterServer, redis_cluster_url: str) -> None:
    ctl = _node_of(redis_cluster, CTL_SLOT)
    others = set(range(3)) - {ctl}
    a = _chain_on(redis_cluster, others, 6, 1)  # survives the control shard's loss
    bchain = _chain_on(redis_cluster, others, 6, 20_000)

    async def body(b: ClusterBackend) -> None:
        await b.register(rec("w0"))  # handle 1
        await b.register(rec("w1"))  # handle 2
        await b.apply_events("w0", [IndexEvent(1, IndexStored(tuple(a)))])
        await b.apply_events("w1", [IndexEvent(1, IndexStored(tuple(bchain)))])
        assert await b.lookup(NS, a, T0) == {"w0": BlockMatch(6, 6)}
        redis_cluster.kill_node(ctl)
        redis_cluster.restart_node(ctl)  # registry, records, live maps, handles: gone
        assert await b.workers() == []
        await b.register(rec("w1"))  # handle 1 again: w0's old number
        await b.register(rec("w0"))
        assert await b.lookup(NS, a, T0) == {}
        assert await b.lookup(NS, bchain, T0) == {}
        for i in others:  # the old entries are deleted, not only unreachable
            with redis.Redis.from_url(redis_cluster.node_urls[i]) as c:
                assert not [k for k in c.scan_iter(match=keys.BLOCK_KEYS_MATCH)
                            if len(k) > 7]  # not a sentinel or fence
        await b.apply_events("w1", [IndexEvent(1, IndexStored(tuple(a)))])
        assert await b.lookup(NS, a, T0) == {"w1": BlockMatch(6, 6)}

    run(redis_cluster_url, body)


def test_a_batch_still_writing_a_retired_handle_leaves_nothing_after_the_sweep(
        redis_cluster_url: str) -> None:
    """Its writes that land before the sweep are dropped by it; its end step is refused."""
    chain = H(7, 1, 2, 3, 4, 5, 6, 7)

    async def body(b: ClusterBackend) -> None:
        c = b.client
        await b.register(rec("w"))
        await b.apply_events("w", [IndexEvent(1, IndexStored(tuple(chain[:2])))])
        slot, lk = lanes.lane(NS, "w")
        # a batch begins on the lane and stalls before its writes ...
        begin, _ = await b.step(cluster_mod.APPLY_BEGIN, slot, lk,
                                [2, 2, "0", 0, 0, 6, "tok", b.gen])
        assert int(begin[0]) == 1
        ticket, h = int(begin[2]), int(begin[3])
        await b.register(rec("w"))  # ... its handle is retired meanwhile ...
        assert str(h) in await c.smembers(keys.DEAD)
        hb = keys.handle_bytes(h)
        await b.wave([(TAG_SLOTS[keys.tag(x)], cluster_mod.TAG_WRITE.call(
            keys.block_key(x), [b"35", hb, str(ticket).encode(), b"S", b"1", b"1",
                                keys.block_key(x)]))
            for x in chain[2:]])
        # ... its writes land late, then it ends: refused, the lane is a new registration's
        end, _ = await b.step(cluster_mod.APPLY_END, slot, lk, ["tok", "0", 2, 6, 0, 0])
        assert int(end[0]) == -1
        assert await b.sweep() == 8
        assert str(h) in await c.smembers(keys.FREE)
        assert await b.lookup(NS, chain, T0) == {}
        for url in (await _node_urls(b)):
            with redis.Redis.from_url(url) as r:
                assert not [k for k in r.scan_iter(match=keys.BLOCK_KEYS_MATCH)
                            if len(k) > 7]  # not a sentinel or fence

    run(redis_cluster_url, body)


async def _node_urls(b: ClusterBackend) -> list[str]:
    kw = b.client.get_primaries()[0].connection_kwargs
    return [f"redis://:{kw['password']}@{n.host}:{n.port}/0" for n in b.client.get_primaries()]


def test_the_cluster_keyspace(redis_cluster: RedisClusterServer,
                              redis_cluster_url: str) -> None:
    """keys.py's keys, plus the generation, the ticket counter, per tag one sentinel, the
    fence floor and one fence per swept handle: nothing else, and nothing of a batch's bookkeeping
    (pend) left on the worker's lane once it is done."""
    chain = _spread_chain(redis_cluster)

    async def body(b: ClusterBackend) -> None:
        await b.register(rec("a"))
        await b.apply_events("a", [IndexEvent(1, IndexStored(tuple(chain)))])
        retired = keys.handle_bytes(int(await b.client.hget(keys.lane_key(NS, "a"), "h")))
        await b.sync_worker("a", 1, [IndexStored(tuple(chain[:3]))])
        await b.add_provisional(NS, chain + [H(99)[0]], "a", len(chain), T0, 2000)
        await b.sweep()  # the retired handle's entries go
        got: set[bytes] = set()
        for url in redis_cluster.node_urls:
            with redis.Redis.from_url(url) as r:
                got |= set(r.keys("*"))
        control = {k.encode() for k in (keys.REGISTRY, keys.HANDLES, keys.FREE,
                                        keys.live_key(NS), keys.prov_marker(NS),
                                        keys.worker_key(NS, "a"), keys.CTL + "gen",
                                        keys.CTL + "ticket", keys.lane_key(NS, "a"))}
        # per tag its sentinel, the fence floor (the first registration recovered the empty
        # index) and the fence of the handle the snapshot retired
        sentinels = {b"{" + bytes([t]) + b"}" + c for t in keys.TAGS
                     for c in (b"!", b"#*", b"#" + retired)}
        blocks = {keys.block_key(h) for h in chain[:3]}
        assert got == blocks | {keys.prov_key(NS, H(99)[0])} | control | sentinels
        lane_a = await b.client.hgetall(keys.lane_key(NS, "a"))
        assert "pend" not in lane_a and lane_a["n"] == "3" and lane_a["seq"] == "1"

    run(redis_cluster_url, body)
