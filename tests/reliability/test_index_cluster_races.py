"""The two races of the cluster sweep on a real 3-primary Redis Cluster, played step by
step: a batch's wave stalled past a sweep lands after its handle was swept and drawn
again (``handle_fence.py``), and a slot migrates between two sweep steps
(``sweep_layout.py``)."""
from __future__ import annotations

import redis

from deploy.redis_cluster import RedisClusterServer
from service.index import cluster as cluster_mod
from service.index import lanes
from service.index.base import BlockMatch, IndexEvent, IndexStored
from service.index.cluster import TAG_SLOTS, ClusterBackend
from service.index.redis import keys
from tests.reliability.test_index_cluster_split import _node_of, run
from tests.service.index.test_base import NS, T0, H, rec


def _late_wave(b: ClusterBackend, chain: list[bytes], ticket: int, h: int):
    """The wave of a batch begun with ``ticket`` holding ``chain`` for handle ``h``."""
    hb, t = keys.handle_bytes(h), str(ticket).encode()
    return b.wave([(TAG_SLOTS[keys.tag(x)], cluster_mod.TAG_WRITE.call(
        keys.block_key(x), [b"35", hb, t, b"S", b"1", b"1", keys.block_key(x)]))
        for x in chain])


def test_a_wave_stalled_past_a_sweep_never_lands_on_a_reassigned_handle(
        redis_cluster_url: str) -> None:
    chain = H(7, 1, 2, 3, 4, 5)
    other = H(8, 1, 2)

    async def body(b: ClusterBackend) -> None:
        c = b.client
        await b.register(rec("w"))
        await b.apply_events("w", [IndexEvent(1, IndexStored(tuple(chain[:2])))])
        slot, lk = lanes.lane(NS, "w")
        # a batch begins on the worker's lane and its replica stalls ...
        begin, _ = await b.step(cluster_mod.APPLY_BEGIN, slot, lk,
                                [2, 2, "0", 0, 0, 4, "tok", b.gen])
        assert int(begin[0]) == 1, begin
        ticket, h = int(begin[2]), int(begin[3])
        await b.register(rec("w"))  # ... its handle is retired ...
        assert await b.sweep() == 2  # ... swept (nothing waits for the stalled batch), freed
        assert str(h) in await c.smembers(keys.FREE)
        await b.register(rec("v"))  # the free handle goes to another worker
        assert (await b.get_worker("v")) is not None
        assert int(await c.hget(keys.worker_key(NS, "v"), "h")) == h
        await b.apply_events("v", [IndexEvent(1, IndexStored(tuple(other)))])
        # the stalled replica wakes: its wave writes handle h, now v's
        assert await _late_wave(b, chain, ticket, h) == [[0]] * len(chain)
        assert await b.lookup(NS, chain, T0) == {}  # refused: v is claimed nothing
        assert await b.lookup(NS, other, T0) == {"v": BlockMatch(3, 3)}
        # v's own batches write the same handle with v's ticket, drawn after the sweep
        await b.apply_events("v", [IndexEvent(2, IndexStored(tuple(chain)))])
        assert await b.lookup(NS, chain, T0) == {"v": BlockMatch(6, 6)}

    run(redis_cluster_url, body)


def _migrate(cluster: RedisClusterServer, slot: int, src: int, dst: int, finish: bool = True
             ) -> None:
    """Move ``slot``'s keys from node ``src`` to ``dst`` (CLUSTER SETSLOT + MIGRATE, as
    ``valkey-cli --cluster reshard`` does); ``finish=False`` stops before SETSLOT NODE."""
    a, z = (redis.Redis.from_url(cluster.node_urls[i]) for i in (src, dst))
    with a, z:
        aid, zid = a.execute_command("CLUSTER MYID"), z.execute_command("CLUSTER MYID")
        z.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", aid)
        a.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", zid)
        ks = a.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
        if ks:
            n = cluster.nodes[dst]
            a.execute_command("MIGRATE", n.host, n.port, "", 0, 5000, "AUTH",
                              cluster.password, "KEYS", *ks)
    if finish:
        _assign(cluster, slot, dst)


def _assign(cluster: RedisClusterServer, slot: int, dst: int) -> None:
    """``CLUSTER SETSLOT slot NODE`` (node ``dst``) on every node: a migration's end."""
    with redis.Redis.from_url(cluster.node_urls[dst]) as z:
        zid = z.execute_command("CLUSTER MYID")
    for url in cluster.node_urls:
        with redis.Redis.from_url(url) as r:
            r.execute_command("CLUSTER SETSLOT", slot, "NODE", zid)


def test_a_slot_migrating_between_two_sweep_steps_is_swept_on_its_new_node(
        redis_cluster: RedisClusterServer, redis_cluster_url: str) -> None:
    chain = H(3, 1, 2, 3, 4, 5, 6, 7)
    t = keys.tag(chain[0])
    slot = TAG_SLOTS[t]
    src = _node_of(redis_cluster, slot)
    dst = (src + 1) % 3

    async def body(b: ClusterBackend) -> None:
        c = b.client
        await b.register(rec("w"))
        await b.apply_events("w", [IndexEvent(1, IndexStored(tuple(chain)))])
        h = int(await c.hget(keys.worker_key(NS, "w"), "h"))
        await b.register(rec("w"))  # h retired: a cycle will drop its entries
        assert await b.sweep(max_steps=2) == 8  # fenced, every node scanned once
        assert await c.hget(keys.SWEEP, "c")  # every node done: a later step confirms
        # a key of h the scans never saw (as one the source had not reached yet) ...
        missed = keys.block_key(bytes([chain[0][0]]) + bytes(31))
        with redis.Redis.from_url(redis_cluster.node_urls[src]) as r:
            r.set(missed, keys.handle_bytes(h) + b"\x01")
        try:
            # ... moves to a node whose scan is done, between two sweep steps
            _migrate(redis_cluster, slot, src, dst, finish=False)
            assert await b.sweep(max_steps=1) == 0  # importing: those scans start over
            assert str(h) not in await c.smembers(keys.FREE)
            _assign(redis_cluster, slot, dst)  # the migration ends
            await c.initialize()
            assert await b.sweep() == 1  # found on its new node and dropped
            assert str(h) in await c.smembers(keys.FREE)
            with redis.Redis.from_url(redis_cluster.node_urls[dst]) as r:
                assert r.get(missed) is None
        finally:  # the session cluster's layout again
            _assign(redis_cluster, slot, dst)
            _migrate(redis_cluster, slot, dst, src)
            redis_cluster.wait_ok()
            await c.initialize()

    run(redis_cluster_url, body)


def test_a_cycle_begun_by_the_previous_version_is_fenced_and_finished(
        redis_cluster_url: str) -> None:
    """A sweep cycle left by a service of the layout before fences (no ``tc``, no
    ``nodes``: only ``id`` and a cursor per primary) is fenced and completed, not wedged."""
    chain = H(5, 1, 2)

    async def body(b: ClusterBackend) -> None:
        c = b.client
        await b.register(rec("w"))
        await b.apply_events("w", [IndexEvent(1, IndexStored(tuple(chain)))])
        h = await c.hget(keys.worker_key(NS, "w"), "h")
        await b.register(rec("w"))
        await c.smove(keys.DEAD, keys.CYCLE, h)
        await c.hset(keys.SWEEP, mapping={"id": "1.1", **{n.name: "0"
                                                           for n in c.get_primaries()}})
        assert await b.sweep() == 3
        assert h in await c.smembers(keys.FREE) and not await c.exists(keys.SWEEP)
        assert await b.lookup(NS, chain, T0) == {}

    run(redis_cluster_url, body)
