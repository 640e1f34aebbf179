"""Redis-specific properties: one round trip per lookup, scripts by SHA with NOSCRIPT
recovery, the documented key layout (one hash tag per chain), no garbage left behind, and
IndexUnavailable (not a hang) when the server is down."""
from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest

from deploy.redis_server import RedisServer
from service.index.base import BlockMatch, IndexUnavailable, KvEvent, Stored, WorkerLoad
from service.index.redis import RedisBackend
from tests.service.test_backends import NS, T0, H, rec


def count_calls(b: RedisBackend) -> list[tuple[Any, ...]]:
    """Record every command the backend's client sends (one entry = one round trip)."""
    calls: list[tuple[Any, ...]] = []
    original = b.client.execute_command

    async def counting(*args: Any, **kw: Any) -> Any:
        calls.append(args)
        return await original(*args, **kw)

    b.client.execute_command = counting  # type: ignore[method-assign]
    return calls


def test_lookup_is_one_round_trip_by_sha(redis_url: str) -> None:
    async def main() -> None:
        b = RedisBackend.from_url(redis_url)
        try:
            for w in "abc":
                await b.register(rec(w))
            chain = H(*range(600))  # 600 blocks: a ~10K-token prompt at block size 16
            await b.apply_events("a", [KvEvent(1, Stored(tuple(chain)))])
            await b.apply_events("b", [KvEvent(1, Stored(tuple(chain[:100])))])
            await b.add_provisional(NS, chain, "c", 0, T0, 2000)
            await b.load_scripts()
            calls = count_calls(b)
            got = await b.lookup(NS, chain, T0 + 1, ["a", "b", "c"])
            assert got == {"a": BlockMatch(600, 600), "b": BlockMatch(100, 100),
                           "c": BlockMatch(600, 600)}
            assert len(calls) == 1 and calls[0][0] == "EVALSHA"
            # a flushed script cache (server restart) costs a reload, never an error
            await b.client.script_flush()
            calls.clear()
            assert await b.lookup(NS, chain, T0 + 1, ["b"]) == {"b": BlockMatch(100, 100)}
            assert [c[0] for c in calls] == ["EVALSHA", "SCRIPT LOAD", "EVALSHA"]
        finally:
            await b.close()

    asyncio.run(main())


def test_every_key_of_a_chain_shares_one_hash_tag(redis_url: str) -> None:
    async def main() -> None:
        b = RedisBackend.from_url(redis_url)
        try:
            await b.register(rec("a"))
            c1, c2 = H(1, 2, 3), H(7, 8)
            await b.apply_events("a", [KvEvent(1, Stored(tuple(c1))),
                                       KvEvent(2, Stored(tuple(c2)))])
            await b.add_provisional(NS, c1 + H(1, 2, 3, 4)[3:], "a", 3, T0, 2000)
            keys = sorted(await b.client.keys("kvm:*"))
            tags: dict[str, set[str]] = {}
            for k in keys:
                m = re.fullmatch(r"kvm:\{([^}]*)\}:([bp]:[0-9a-f]{64}|pm|blocks)|kvm:\{([^}]*)\}"
                                 r"|kvm:workers", k)
                assert m, k
                tag = m.group(1) or m.group(3)
                if tag:
                    tags.setdefault(tag.split("|")[1], set()).add(k)
            assert "{" not in NS and "}" not in NS  # the model name had braces: encoded
            assert len(tags[c1[0].hex()]) == 5     # 3 blocks + provisional + marker: one tag
            assert len(tags[c2[0].hex()]) == 2
            kp = f"kvm:{{{NS}|{c1[0].hex()}}}:"
            assert await b.client.mget([f"{kp}b:{h.hex()}" for h in c1]) == [";a=1"] * 3
            assert tags["w:a"] == {f"kvm:{{{NS}|w:a}}", f"kvm:{{{NS}|w:a}}:blocks"}
            # purging leaves no block keys behind (provisional keys expire by TTL)
            assert await b.purge_worker("a")
            left = [k for k in await b.client.keys("kvm:*") if ":p" not in k]
            assert left == []
            h4 = H(1, 2, 3, 4)[3].hex()
            assert 0 < await b.client.pttl(f"{kp}p:{h4}") <= 2000
        finally:
            await b.close()

    asyncio.run(main())


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
