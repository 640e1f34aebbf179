"""A batch's writes as one script call per node of a real 3-primary Redis Cluster
(``service/index/node_waves.py``): one call per node, and a call that meets a slot its node
does not serve changes nothing and is sent again per tag, counted once."""
from __future__ import annotations

import asyncio

import pytest
import redis.exceptions as rexc

from deploy.redis_cluster import RedisClusterServer
from service.index import node_waves
from service.index.base import BlockMatch, IndexEvent, IndexRemoved, IndexStored
from service.index.cluster import SLOT_OF_BYTE, TAG_SLOTS, ClusterBackend
from service.index.redis import keys
from tests.reliability.test_index_cluster_split import _node_of, _spread_chain, run
from tests.service.index.test_base import NS, T0, H, rec

pytestmark = [pytest.mark.integration, pytest.mark.cluster_layout]


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[list[tuple[int, bytes]]]:
    """Every batch sent through ``ClusterBackend.wave_replies``."""
    seen: list[list[tuple[int, bytes]]] = []
    real = ClusterBackend.wave_replies

    async def spy(self, batch, retry=False):
        seen.append(list(batch))
        return await real(self, batch, retry)

    monkeypatch.setattr(ClusterBackend, "wave_replies", spy)
    return seen


def _writes(seen: list[list[tuple[int, bytes]]]) -> list[list[tuple[int, bytes]]]:
    return [[c for c in batch if node_waves.NODE_WRITE.sha in c[1]] for batch in seen
            if any(node_waves.NODE_WRITE.sha in c[1] for c in batch)]


def test_a_batch_on_every_tag_is_one_write_call_per_node(
        redis_cluster: RedisClusterServer, redis_cluster_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    chain = H(*range(600))[:400]  # nearly every one of the 64 tags, on every shard
    assert len({keys.tag(h) for h in chain}) >= keys.N_TAGS - 2

    async def body(b: ClusterBackend) -> None:
        await b.register(rec("w"))
        seen = _spy(monkeypatch)
        res = await b.apply_events("w", [IndexEvent(1, IndexStored(tuple(chain))),
                                         IndexEvent(2, IndexRemoved(tuple(chain[300:])))])
        assert res.applied == 2
        (wave,) = _writes(seen)
        nodes = {_node_of(redis_cluster, slot) for slot, _ in wave}
        assert len(wave) == len(nodes) == 3
        assert await b.lookup(NS, chain, T0) == {"w": BlockMatch(300, 300)}
        (w,) = await b.workers(with_blocks=True)
        assert w.indexed_blocks == 300

    run(redis_cluster_url, body)


def test_a_stale_slot_map_costs_a_write_per_tag_never_a_wrong_count(
        redis_cluster: RedisClusterServer, redis_cluster_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The service's map says one node serves every tag (as after a resharding it has not
    seen): the node's call meets keys of other nodes, fails before it writes, and the
    batch lands per tag, each entry counted once."""
    chain = _spread_chain(redis_cluster)

    async def one_node(b, tags):
        return [list(tags)]

    async def body(b: ClusterBackend) -> None:
        await b.register(rec("w"))
        assert (await b.apply_events("w", [IndexEvent(1, IndexStored(tuple(chain[:4])))]
                                     )).applied == 1
        seen = _spy(monkeypatch)
        monkeypatch.setattr(node_waves, "by_node", one_node)
        res = await b.apply_events("w", [IndexEvent(2, IndexStored(tuple(chain[4:]),
                                                                   chain[3]))])
        assert res.applied == 1
        first, again = _writes(seen)
        assert len(first) == 1  # the one call the wrong map asked for ...
        tags = {keys.tag(h) for h in chain[4:]}
        assert len(again) == len(tags)  # ... then one per tag
        assert await b.lookup(NS, chain, T0) == {"w": BlockMatch(len(chain), len(chain))}
        (w,) = await b.workers(with_blocks=True)
        assert w.indexed_blocks == len(chain)

    run(redis_cluster_url, body)


def test_a_write_call_that_meets_a_foreign_key_changes_nothing(
        redis_cluster: RedisClusterServer, redis_cluster_url: str) -> None:
    """The script reads every key before it writes any: keys of its own node first, one
    of another node last, and none of its own is written."""
    mine = [h for h in H(*range(200)) if _node_of(redis_cluster, TAG_SLOTS[keys.tag(h)]) == 0]
    foreign = next(h for h in H(*range(1000, 1200))
                   if _node_of(redis_cluster, TAG_SLOTS[keys.tag(h)]) != 0)
    ks = [keys.block_key(h) for h in mine[:20]]
    head = [b"35", keys.handle_bytes(1), b"10"]
    args = [b"S", b"1", b"1", b"".join(ks), b"S", b"1", b"1", keys.block_key(foreign)]

    async def body(b: ClusterBackend) -> None:
        (r,) = await b.wave_replies([(SLOT_OF_BYTE[ks[0][1]],
                                      node_waves.NODE_WRITE.call(ks[0], head + args))])
        assert isinstance(r, rexc.ResponseError) and "non local key" in str(r)
        assert [await b.client.get(k) for k in ks] == [None] * len(ks)
        (ok,) = await b.wave([(SLOT_OF_BYTE[ks[0][1]],
                               node_waves.NODE_WRITE.call(ks[0], head + args[:4]))])
        assert ok == [len(ks)] and None not in [await b.client.get(k) for k in ks]

    run(redis_cluster_url, body)


def test_workers_racing_on_shared_blocks_each_keep_their_entries(
        redis_cluster_url: str) -> None:
    """Eight workers store one shared chain (a system prompt) and evict and store private
    tails, all batches at once: every node call merges into values other calls change at
    the same time, and each worker ends holding exactly what its events say."""
    shared = H(*range(64))

    async def body(b: ClusterBackend) -> None:
        names = [f"w{i}" for i in range(8)]
        for n in names:
            await b.register(rec(n))

        async def one(i: int, n: str) -> None:
            tail = H(*range(1000 * (i + 1), 1000 * (i + 1) + 16))
            res = await b.apply_events(n, [
                IndexEvent(1, IndexStored(tuple(shared))),
                IndexEvent(2, IndexStored(tuple(tail), shared[-1])),
                IndexEvent(3, IndexRemoved(tuple(tail[8:])))])
            assert res.applied == 3

        await asyncio.gather(*(one(i, n) for i, n in enumerate(names)))
        assert await b.lookup(NS, shared, T0) == {n: BlockMatch(64, 64) for n in names}
        for i, n in enumerate(names):
            tail = H(*range(1000 * (i + 1), 1000 * (i + 1) + 16))
            got = await b.lookup(NS, shared + tail, T0, [n])
            assert got == {n: BlockMatch(72, 72)}, (n, got)
        assert sorted(w.indexed_blocks for w in await b.workers(with_blocks=True)) == [72] * 8

    run(redis_cluster_url, body)


def test_batches_waiting_behind_two_waves_merge_into_one_and_keep_their_counts(
        redis_cluster_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two batches' waves in flight (held), six more batches of other workers arrive: the
    six go as one wave (one call per node for all six), and each worker ends with exactly
    its own entries, counts and seqs."""
    names = [f"w{i}" for i in range(8)]
    chains = {n: H(*range(100 * i, 100 * i + 40)) for i, n in enumerate(names)}

    async def body(b: ClusterBackend) -> None:
        for n in names:
            await b.register(rec(n))
        seen = _spy(monkeypatch)
        held, real = asyncio.Event(), ClusterBackend.wave_replies
        waves = 0

        async def hold(self, batch, retry=False):
            nonlocal waves
            if batch and node_waves.NODE_WRITE.sha in batch[0][1]:
                waves += 1
                if waves <= 2:
                    await held.wait()
            return await real(self, batch, retry)

        monkeypatch.setattr(ClusterBackend, "wave_replies", hold)
        tasks = [asyncio.create_task(b.apply_events(n, [
            IndexEvent(1, IndexStored(tuple(chains[n][:30]))),
            IndexEvent(2, IndexRemoved(tuple(chains[n][20:30]))),
            IndexEvent(3, IndexStored(tuple(chains[n][30:]), chains[n][19]))]))
            for n in names]
        for _ in range(500):
            if len(b.writes._queue) == 6:
                break
            await asyncio.sleep(0.01)
        assert b.writes.flying == 2 and len(b.writes._queue) == 6
        held.set()
        assert [r.applied for r in await asyncio.gather(*tasks)] == [3] * 8
        monkeypatch.undo()
        writes = _writes(seen)
        assert len(writes) == 3 and b.writes.merged == 6  # two alone, then six as one
        assert max(len(w) for w in writes) <= 3  # a call per node, whatever the batches
        for n in names:
            want = 20 + 10  # blocks 0-19 and 30-39: 20-29 removed
            assert await b.lookup(NS, chains[n], T0, [n]) == {n: BlockMatch(20, 20)}
            got = await b.lookup(NS, chains[n][:20] + chains[n][30:], T0, [n])
            assert got == {n: BlockMatch(want, want)}
        assert {w.worker_id: (w.indexed_blocks, w.last_seq)
                for w in await b.workers(with_blocks=True)} == dict.fromkeys(names, (30, 3))

    run(redis_cluster_url, body)


def test_a_merged_node_call_refuses_only_the_fenced_batch(
        redis_cluster: RedisClusterServer, redis_cluster_url: str) -> None:
    """Two batches in one node call, one of a handle fenced on the keys' tag at its ticket
    (a retired handle's late wave): its entries are refused, the other batch's (fenced
    below its own ticket) land, and each batch gets its own count."""
    mine = [h for h in H(*range(200)) if _node_of(redis_cluster, TAG_SLOTS[keys.tag(h)]) == 0]
    tag = keys.tag(mine[0])
    same = [h for h in mine if keys.tag(h) == tag][:3]
    ks = [keys.block_key(h) for h in same]
    late, live = keys.handle_bytes(7), keys.handle_bytes(8)
    head = [b"35", late + live, b"10,12"]
    args = [b"S", b"1", b"1", b"".join(ks), b"S", b"2", b"1", b"".join(ks)]

    async def body(b: ClusterBackend) -> None:
        await b.client.set(ks[0][:3] + b"#" + late, b"10")  # fenced at its ticket
        await b.client.set(ks[0][:3] + b"#" + live, b"11")  # an older cycle's: below 12
        (r,) = await b.wave([(SLOT_OF_BYTE[ks[0][1]],
                              node_waves.NODE_WRITE.call(ks[0], head + args))])
        assert r == [0, 3]
        for k in ks:
            assert await b.client.get(k) == (live + b"\x01").decode()  # 8's entry alone

    run(redis_cluster_url, body)
