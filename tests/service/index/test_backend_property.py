"""Property: for random operation streams the redis and memory backends answer every lookup
identically, and both equal a brute-force model written independently of them."""
from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.index.base import (
    ApplyStatus,
    BlockMatch,
    IndexCleared,
    IndexEvent,
    IndexRemoved,
    IndexStored,
    WorkerRecord,
    namespace,
)
from service.index.memory import MemoryBackend
from service.index.redis import RedisBackend

NS = namespace("prop", 2, "sha256_cbor")
WORKERS = ("w0", "w1", "w2")
# a small forest of chains: paths of a tree of depth <= 5 with branching 2, two roots
PATHS = [(r, *rest) for r in (1, 2) for n in range(5)
         for rest in [tuple((i >> k) & 1 for k in range(n)) for i in range(2 ** n)]]


def chain(path: tuple[int, ...]) -> list[bytes]:
    return [hashlib.sha256(repr(path[:i + 1]).encode()).digest() for i in range(len(path))]


# --- the brute-force model ----------------------------------------------------------------

@dataclass
class Model:
    held: dict[str, dict[bytes, int]] = field(default_factory=dict)  # worker -> hash -> mask
    seq: dict[str, int] = field(default_factory=dict)
    prov: dict[bytes, dict[str, int]] = field(default_factory=dict)

    def apply(self, w: str, events: list[IndexEvent]) -> tuple[ApplyStatus, int]:
        """Status and number of events applied."""
        if w not in self.seq:
            return ApplyStatus.UNKNOWN_WORKER, 0
        if events[-1].seq <= self.seq[w]:
            return ApplyStatus.DUPLICATE, 0
        if events[0].seq > self.seq[w] + 1:
            return ApplyStatus.GAP, 0
        mine = self.held[w]
        fresh = [ev for ev in events if ev.seq > self.seq[w]]  # a retry's overlap: skipped
        for ev in fresh:
            op = ev.op
            if isinstance(op, IndexStored) and (not op.parent or op.parent in mine):
                for h in op.hashes:
                    mine[h] = mine.get(h, 0) | (1 << (op.tier - 1))
            elif isinstance(op, IndexRemoved):
                bits = 7 if op.tier == 0 else 1 << (op.tier - 1)
                for h in op.hashes:
                    if h in mine:
                        mine[h] &= ~bits
                        if not mine[h]:
                            del mine[h]
            elif isinstance(op, IndexCleared):
                mine.clear()
        self.seq[w] = events[-1].seq
        return ApplyStatus.OK, len(fresh)

    def sync(self, w: str, seq: int, blocks: list[IndexStored]) -> None:
        parent: dict[bytes, bytes] = {}
        mask: dict[bytes, int] = {}
        for s in blocks:
            prev = s.parent
            for h in s.hashes:
                parent.setdefault(h, prev)
                mask[h] = mask.get(h, 0) | (1 << (s.tier - 1))
                prev = h

        def reaches_start(h: bytes, depth: int = 0) -> bool:
            p = parent.get(h)
            return p is not None and depth < 64 and (p == b"" or reaches_start(p, depth + 1))

        self.held[w] = {h: m for h, m in mask.items() if reaches_start(h)}
        self.seq[w] = seq

    def lookup(self, hashes: list[bytes], now: int, allowed: set[str] | None) -> dict:
        out = {}
        # provisional entries count whether or not the worker is registered (the service
        # only ever asks about live workers)
        everyone = set(self.held) | {w for hs in self.prov.values() for w in hs}
        for w in sorted(everyone):
            if allowed is not None and w not in allowed:
                continue
            mine = self.held.get(w, {})
            c = [0, 0, 0, 0]
            for h in hashes:
                m = mine.get(h, 0)
                if not m and self.prov.get(h, {}).get(w, 0) > now:
                    m = 1
                if not m:
                    break
                c[0] += 1
                c[1 if m & 1 else 2 if m & 2 else 3] += 1
            if c[0]:
                out[w] = BlockMatch(*c)
        return out


# --- random streams -------------------------------------------------------------------------

paths = st.sampled_from(PATHS)
workers = st.sampled_from(WORKERS)
tiers = st.sampled_from((1, 1, 2, 3))


@st.composite
def stored(draw: st.DrawFn) -> IndexStored:
    c = chain(draw(paths))
    s = draw(st.integers(0, len(c) - 1))
    return IndexStored(tuple(c[s:]), c[s - 1] if s else b"", draw(tiers))


@st.composite
def removed(draw: st.DrawFn) -> IndexRemoved:
    c = chain(draw(paths))
    return IndexRemoved(tuple(draw(st.lists(st.sampled_from(c), min_size=1, max_size=3))),
                        draw(st.sampled_from((0, 1, 2, 3))))


events = st.tuples(
    st.just("events"), workers,
    st.lists(st.one_of(stored(), stored(), removed(), removed(), st.just(IndexCleared())),
             min_size=1, max_size=4),
    # seq skew: 0 ok, 1 gap, < 0 duplicate or (several events) a retry overlapping applied ones
    st.sampled_from((0, 0, 0, 0, 1, -1, -2)))
ops = st.one_of(
    events, events, events, events,
    st.tuples(st.just("sync"), workers, st.lists(stored(), max_size=4), st.integers(0, 50)),
    st.tuples(st.just("prov"), workers, paths, st.integers(0, 4)),
    st.tuples(st.just("tick"), st.sampled_from((0, 500, 1999, 2000, 2001, 3000))),
    st.tuples(st.just("lookup"), paths),
    st.tuples(st.sampled_from(("register", "purge")), workers),
)


async def compare(mem: MemoryBackend, red: RedisBackend, model: Model,
                  path: tuple[int, ...], now: int) -> None:
    c = chain(path)
    for allowed in (None, {"w0", "w2"}):
        want = model.lookup(c, now, allowed)
        assert await mem.lookup(NS, c, now, allowed) == want, (path, allowed)
        assert await red.lookup(NS, c, now, allowed) == want, (path, allowed)


async def check(url: str, stream: list[tuple]) -> None:
    mem, red, model = MemoryBackend(), RedisBackend.from_url(url), Model()
    await red.client.flushall()
    now = 10_000
    try:
        for w in WORKERS:
            r = WorkerRecord(w, NS, "h:1", "prop", 2, "sha256_cbor")
            await mem.register(r)
            await red.register(r)
            model.held[w], model.seq[w] = {}, 0
        for op in stream:
            kind = op[0]
            if kind == "events":
                _, w, ops_, skew = op
                first = model.seq.get(w, 0) + 1 + skew
                evs = [IndexEvent(max(first, 1) + i, o) for i, o in enumerate(ops_)]
                want = model.apply(w, evs)
                got = await mem.apply_events(w, evs)
                assert (got.status, got.applied) == want
                got = await red.apply_events(w, evs)
                assert (got.status, got.applied) == want
            elif kind == "sync":
                _, w, blocks, seq = op
                if w in model.seq:
                    model.sync(w, seq, blocks)
                n_mem = await mem.sync_worker(w, seq, blocks)
                assert n_mem == await red.sync_worker(w, seq, blocks)
                assert n_mem == (len(model.held[w]) if w in model.seq else None)
            elif kind == "prov":
                _, w, path, start = op
                c = chain(path)
                await mem.add_provisional(NS, c, w, start, now, 2000)
                await red.add_provisional(NS, c, w, start, now, 2000)
                for h in c[start:]:
                    holders = {k: v for k, v in model.prov.get(h, {}).items() if v > now}
                    holders[w] = now + 2000
                    model.prov[h] = holders
            elif kind == "tick":
                now += op[1]
            elif kind == "lookup":
                await compare(mem, red, model, op[1], now)
            elif kind == "register":
                r = WorkerRecord(op[1], NS, "h:1", "prop", 2, "sha256_cbor")
                await mem.register(r)
                await red.register(r)
                model.held[op[1]], model.seq[op[1]] = {}, 0
            elif kind == "purge":
                assert await mem.purge_worker(op[1]) == await red.purge_worker(op[1])
                model.held.pop(op[1], None)
                model.seq.pop(op[1], None)
        for path in PATHS[::3]:
            await compare(mem, red, model, path, now)
        counts = {w.worker_id: w.indexed_blocks for w in await red.workers(with_blocks=True)}
        assert counts == {w.worker_id: w.indexed_blocks
                          for w in await mem.workers(with_blocks=True)}
        assert counts == {w: len(h) for w, h in model.held.items()}
    finally:
        await red.close()


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(stream=st.lists(ops, min_size=6, max_size=30))
def test_redis_memory_and_model_agree(redis_url: str, stream: list[tuple]) -> None:
    asyncio.run(check(redis_url, stream))
