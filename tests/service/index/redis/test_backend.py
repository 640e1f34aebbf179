"""Redis-specific properties: one round trip per lookup (hand-packed commands equal to
redis-py's), the documented key layout (keys.py), the sweep (no garbage left behind, handles
reused only once clean), tags that spread over cluster slots, and IndexUnavailable (not a
hang) when the server is down."""
from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import numpy as np
import pytest
import redis.asyncio
from redis.asyncio.connection import Connection
from redis.crc import key_slot

from deploy.redis_server import RedisServer
from kvmesh.quota import Quota, Quotas
from service.index.base import (
    TIER_CPU,
    BlockMatch,
    IndexCleared,
    IndexEvent,
    IndexStored,
    IndexUnavailable,
    WorkerLoad,
)
from service.index.redis import RedisBackend, keys, resp
from tests.service.index.test_base import NS, T0, H, rec


def count_writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the packed writes of every connection (one write, one round trip)."""
    writes: list[int] = []
    original = Connection.send_packed_command

    async def counting(self: Connection, command: Any, check_health: bool = True) -> None:
        writes.append(1)
        await original(self, command, check_health)

    monkeypatch.setattr(Connection, "send_packed_command", counting)
    return writes


def test_lookup_is_one_round_trip(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lookup is one MULTI/EXEC write; one more only when the namespace's live map changed
    since this replica cached it, or provisional entries appeared."""
    async def main() -> None:
        b = RedisBackend.from_url(redis_url)
        try:
            for w in "abc":
                await b.register(rec(w))
            chain = H(*range(600))  # 600 blocks: a ~10K-token prompt at block size 16
            await b.apply_events("a", [IndexEvent(1, IndexStored(tuple(chain)))])
            await b.apply_events("b", [IndexEvent(1, IndexStored(tuple(chain[:100])))])
            writes = count_writes(monkeypatch)
            want = {"a": BlockMatch(600, 600), "b": BlockMatch(100, 100)}
            assert await b.lookup(NS, chain, T0 + 1, ["a", "b", "c"]) == want
            assert len(writes) == 1
            assert await b.lookup(NS, chain, T0 + 1, ["a", "b", "c"]) == want
            assert len(writes) == 2
            await b.add_provisional(NS, chain, "c", 0, T0, 2000)  # the marker appears
            want["c"] = BlockMatch(600, 600)
            writes.clear()
            assert await b.lookup(NS, chain, T0 + 1, ["a", "b", "c"]) == want
            assert len(writes) == 2
            assert await b.lookup(NS, chain, T0 + 1, ["b"]) == {"b": BlockMatch(100, 100)}
            assert len(writes) == 3
            await b.apply_events("b", [IndexEvent(2, IndexCleared())])  # b's handle: retired
            writes.clear()
            assert await b.lookup(NS, chain, T0 + 1, ["a", "b"]) == {"a": BlockMatch(600, 600)}
            assert len(writes) == 2  # the cached live map was stale: read again
        finally:
            await b.close()

    asyncio.run(main())


def test_scripts_run_by_sha_and_survive_a_flushed_script_cache(redis_url: str) -> None:
    async def main() -> None:
        b = RedisBackend.from_url(redis_url)
        try:
            await b.register(rec("a"))
            await b.load_scripts()
            calls: list[str] = []
            original = b.client.execute_command

            async def counting(*args: Any, **kw: Any) -> Any:
                calls.append(args[0])
                return await original(*args, **kw)

            b.client.execute_command = counting  # type: ignore[method-assign]
            await b.apply_events("a", [IndexEvent(1, IndexStored(tuple(H(1, 2))))])
            assert calls == ["EVALSHA"]
            await b.client.script_flush()  # a restarted server: a reload, never an error
            calls.clear()
            await b.apply_events("a", [IndexEvent(2, IndexStored(tuple(H(1, 2, 3)[2:]),
                                                                 H(1, 2)[1]))])
            assert calls == ["EVALSHA", "SCRIPT LOAD", "EVALSHA"]
            assert await b.lookup(NS, H(1, 2, 3), T0) == {"a": BlockMatch(3, 3)}
        finally:
            await b.close()

    asyncio.run(main())


def test_hand_packed_commands_are_what_redis_py_sends() -> None:
    conn = redis.asyncio.Redis().connection_pool.make_connection()
    hs = H(*range(70))
    assert resp.mget(hs) == b"".join(conn.pack_command("MGET", *map(keys.block_key, hs)))
    assert resp.mget(hs, b"p", NS.encode()) == b"".join(
        conn.pack_command("MGET", *(keys.prov_key(NS, h) for h in hs)))
    assert resp.command(b"HGET", b"k", b"v") == b"".join(conn.pack_command("HGET", "k", "v"))
    assert keys.block_keys(hs) == b"".join(map(keys.block_key, hs))
    assert keys.prov_keys(NS, hs) == b"".join(keys.prov_key(NS, h) for h in hs)


@pytest.mark.parametrize("width", [32, 16])
def test_a_cluster_lookups_mgets_are_what_redis_py_sends(width: int) -> None:
    """``resp.mget_runs`` (all of a lookup's per-tag reads built at once): each run's
    block keys, with a namespace each followed by its provisional key, byte for byte."""
    conn = redis.asyncio.Redis().connection_pool.make_connection()
    hs = [h[:width] for h in H(*range(300))]
    raw = np.frombuffer(b"".join(hs), np.uint8).reshape(-1, width)
    bounds = [0, 1, 40, 41, 299, 300]
    runs = [hs[a:z] for a, z in itertools.pairwise(bounds)]
    assert resp.mget_runs(raw, bounds) == [
        b"".join(conn.pack_command("MGET", *map(keys.block_key, r))) for r in runs]
    assert resp.mget_runs(raw, bounds, NS.encode()) == [
        b"".join(conn.pack_command("MGET", *(k for h in r for k in (
            keys.block_key(h), keys.prov_key(NS, h))))) for r in runs]


def test_the_documented_layout(redis_url: str) -> None:
    """Every key is one of keys.py's: block keys are the raw hash behind its tag, holding
    sorted (handle, tier bits) entries; control keys share the {ctl} slot; a chain's blocks
    spread over tags; purge hides the entries at once and the sweep deletes them."""
    async def main() -> None:
        b = RedisBackend.from_url(redis_url)
        raw = redis.asyncio.Redis.from_url(redis_url)  # binary keys and values
        try:
            for w in "ab":
                await b.register(rec(w))
            chain = H(*range(40))
            await b.apply_events("a", [IndexEvent(1, IndexStored(tuple(chain)))])
            await b.apply_events("b", [IndexEvent(1, IndexStored(tuple(chain[:2]), tier=TIER_CPU))])
            await b.add_provisional(NS, chain + H(*range(41))[40:], "a", 40, T0, 2000)
            got = set(await raw.keys("*"))
            blocks = {keys.block_key(h) for h in chain}
            prov = {keys.prov_key(NS, H(*range(41))[40])}
            control = {k.encode() for k in (keys.REGISTRY, keys.HANDLES, keys.live_key(NS),
                                            keys.prov_marker(NS), keys.worker_key(NS, "a"),
                                            keys.worker_key(NS, "b"))}
            assert got == blocks | prov | control
            assert all(key_slot(k) == key_slot(b"{ctl}") for k in control)
            assert len({key_slot(k) for k in blocks}) > 20  # one chain, many slots
            assert "{" not in NS and "}" not in NS  # the model name had braces: encoded
            ha, hb = [int(await b.client.hget(keys.worker_key(NS, w), "h") or 0) for w in "ab"]
            assert 0 < ha < hb
            assert keys.entries(await raw.get(keys.block_key(chain[0]))) == {ha: 1, hb: 2}
            assert await raw.get(keys.block_key(chain[0])) == (keys.handle_bytes(ha) + b"\x01"
                                                              + keys.handle_bytes(hb) + b"\x02")
            assert keys.entries(await raw.get(keys.block_key(chain[5]))) == {ha: 1}
            live = await b.client.hgetall(keys.live_key(NS))
            assert {f: v for f, v in live.items() if f not in "vc"} == {str(ha): "a",
                                                                         str(hb): "b"}
            assert 0 < await b.client.pttl(prov.pop()) <= 2000
            # purging hides a's entries at once; the sweep then deletes them
            assert await b.purge_worker("a")
            assert await b.lookup(NS, chain, T0) == {"b": BlockMatch(2, 0, 2)}
            assert await b.client.smembers(keys.DEAD) == {str(ha)}
            assert await raw.exists(*blocks) == 40
            assert await b.sweep() == 40
            assert await raw.exists(*blocks) == 2
            assert keys.entries(await raw.get(keys.block_key(chain[0]))) == {hb: 2}
            assert await b.client.smembers(keys.FREE) == {str(ha)}  # drawn again next
            await b.register(rec("c"))
            assert await b.client.hget(keys.worker_key(NS, "c"), "h") == str(ha)
            assert await b.sweep() == 0 and not await raw.exists(keys.SWEEP)
        finally:
            await raw.aclose()
            await b.close()

    asyncio.run(main())


def test_a_sweep_cycle_frees_only_handles_retired_before_it_began(redis_url: str) -> None:
    """A handle retired while a cycle runs may still have entries in keys the cycle has
    passed: it waits for the next cycle, and nothing is dropped early."""
    async def main() -> None:
        b = RedisBackend.from_url(redis_url)
        try:
            await b.register(rec("a"))
            await b.register(rec("b"))
            for w, c in (("a", H(1, 2, 3)), ("b", H(7, 8, 9))):
                await b.apply_events(w, [IndexEvent(1, IndexStored(tuple(c)))])
            ha = await b.client.hget(keys.worker_key(NS, "a"), "h")
            await b.apply_events("a", [IndexEvent(2, IndexCleared())])  # retires a's handle
            sweep = [keys.SWEEP, keys.DEAD, keys.CYCLE, keys.FREE]
            state, _, _ = await b._sweep(sweep, [1])  # one key per step: a cycle begins
            assert state == 1 and await b.client.smembers(keys.CYCLE) == {ha}
            hb = await b.client.hget(keys.worker_key(NS, "b"), "h")
            await b.apply_events("b", [IndexEvent(2, IndexCleared())])  # retired mid-cycle
            while state == 1:
                state, _, _ = await b._sweep(sweep, [1])
            assert state == 2
            assert await b.client.smembers(keys.FREE) == {ha}
            assert await b.client.smembers(keys.DEAD) == {hb}
            assert await b.lookup(NS, H(7, 8, 9), T0) == {}  # retired: invisible meanwhile
            assert await b.sweep() == 3
            assert await b.client.smembers(keys.FREE) == {ha, hb}
            assert await b.client.dbsize() == 6  # registry, 2 records, live map, counter, free
        finally:
            await b.close()

    asyncio.run(main())


def test_tags_spread_over_cluster_slots() -> None:
    """64 distinct one-byte tags, never a brace; with S shards owning equal slot ranges
    every shard owns at most 1.125x its share of tags (S = 2..10)."""
    assert len(set(keys.TAGS)) == 64 and not set(keys.TAGS) & set(b"{}")
    slots = [key_slot(keys.TAG_PREFIXES[3 * i:3 * i + 3] + b"x" * 32) for i in range(64)]
    for shards in range(2, 11):
        owned = [0] * shards
        for s in slots:
            owned[s * shards // 16384] += 1
        assert max(owned) <= 1.125 * 64 / shards, (shards, owned)


def test_down_server_raises_index_unavailable_fast(redis_server: RedisServer,
                                                  redis_url: str) -> None:
    async def main() -> None:
        b = RedisBackend.from_url(redis_url, timeout_s=0.3)
        try:
            await b.register(rec("a"))
            redis_server.kill()
            t0 = time.monotonic()
            for call in (b.lookup(NS, H(1, 2), T0), b.heartbeat("a", WorkerLoad(), 0, T0),
                         b.workers()):
                with pytest.raises(IndexUnavailable):
                    await call
            assert time.monotonic() - t0 < 3
            redis_server.start()  # back, empty: the same client recovers by itself
            assert await b.workers() == []
            assert not (await b.heartbeat("a", WorkerLoad(), 0, T0)).known
        finally:
            await b.close()

    asyncio.run(main())


def test_a_lookup_after_a_server_restart_retries_on_a_fresh_connection(
        redis_server: RedisServer, redis_url: str) -> None:
    """A pooled connection that outlived its server is retried once, as redis-py retries
    its own commands: the first route after a Redis restart is not degraded."""
    async def main() -> None:
        b = RedisBackend.from_url(redis_url, timeout_s=0.5)
        try:
            await b.register(rec("a"))
            await b.apply_events("a", [IndexEvent(1, IndexStored(tuple(H(1, 2))))])
            assert await b.lookup(NS, H(1, 2), T0) == {"a": BlockMatch(2, 2)}
            redis_server.kill()
            redis_server.start()  # empty again; the pool still holds the dead connection
            assert await b.lookup(NS, H(1, 2), T0) == {}
        finally:
            await b.close()

    asyncio.run(main())


def test_a_malformed_stored_quota_is_skipped_not_fatal(redis_url: str) -> None:
    """One tenant's field that no quota can be (written by hand) costs that tenant only."""
    async def main() -> None:
        b = RedisBackend.from_url(redis_url)
        try:
            await b.set_quota("a", Quota(gpu=0.3))
            await b.client.hset(keys.QUOTAS, mapping={"b": "{not json", "c": '{"gpu": 7}'})
            assert await b.quotas() == Quotas(tenants={"a": Quota(gpu=0.3)})
        finally:
            await b.close()

    asyncio.run(main())
