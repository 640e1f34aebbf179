"""Index semantics, run identically on the memory and the redis backend (real Valkey)."""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable

import pytest

from kvmesh.quota import ALL_TENANTS, Quota, Quotas
from service.index.base import (
    TIER_CPU,
    TIER_GPU,
    ApplyStatus,
    BlockMatch,
    IndexBackend,
    IndexCleared,
    IndexEvent,
    IndexRemoved,
    IndexStored,
    StaleIncarnation,
    WorkerLoad,
    WorkerRecord,
    namespace,
    resolve_snapshot,
)
from service.index.memory import MemoryBackend
from service.index.redis import RedisBackend

NS = namespace("m/odel{x}", 4, "sha256_cbor")
T0 = 1_000_000


def H(*path: int) -> list[bytes]:
    """A synthetic chain: block i's hash depends on path[:i+1], like a real chain."""
    return [hashlib.sha256(repr(path[:i + 1]).encode()).digest() for i in range(len(path))]


def rec(wid: str, ns: str = NS, hb: int = T0, incarnation: int = 0) -> WorkerRecord:
    return WorkerRecord(wid, ns, f"{wid}:1", "m", 4, "sha256_cbor", heartbeat_ms=hb,
                        incarnation=incarnation)


@pytest.fixture(params=["memory", "redis"])
def backend_factory(request: pytest.FixtureRequest) -> Callable[[], IndexBackend]:
    if request.param == "memory":
        return MemoryBackend
    url = request.getfixturevalue("redis_url")
    return lambda: RedisBackend.from_url(url)


def run(factory: Callable[[], IndexBackend],
        body: Callable[[IndexBackend], Awaitable[None]]) -> None:
    async def main() -> None:
        b = factory()
        try:
            await body(b)
        finally:
            await b.close()

    asyncio.run(main())


def test_lookup_walks_chain_and_stops(backend_factory: Callable[[], IndexBackend]) -> None:
    async def body(b: IndexBackend) -> None:
        for w in "abc":
            await b.register(rec(w))
        chain = H(1, 2, 3, 4, 5)
        await b.apply_events("a", [IndexEvent(1, IndexStored(tuple(chain)))])
        await b.apply_events("b", [IndexEvent(1, IndexStored(tuple(chain[:2])))])
        # c holds blocks 1.. but not block 0: never matches
        await b.apply_events("c", [IndexEvent(1, IndexStored(tuple(chain[1:]), parent=chain[0]))])
        got = await b.lookup(NS, chain, T0)
        assert got == {"a": BlockMatch(5, 5, 0, 0), "b": BlockMatch(2, 2, 0, 0)}
        assert await b.lookup(NS, chain, T0, workers=["b"]) == {"b": BlockMatch(2, 2)}
        assert await b.lookup(NS, H(9, 2, 3), T0) == {}
        assert await b.lookup(namespace("other", 4, "sha256_cbor"), chain, T0) == {}

    run(backend_factory, body)


def test_tiers_and_removal(backend_factory: Callable[[], IndexBackend]) -> None:
    async def body(b: IndexBackend) -> None:
        await b.register(rec("a"))
        chain = H(1, 2, 3)
        await b.apply_events("a", [
            IndexEvent(1, IndexStored(tuple(chain))),
            IndexEvent(2, IndexStored((chain[2],), parent=chain[1], tier=TIER_CPU)),  # on CPU too
            IndexEvent(3, IndexRemoved((chain[2],), tier=TIER_GPU)),  # the CPU copy is left
        ])
        m = (await b.lookup(NS, chain, T0))["a"]
        assert (m.blocks, m.gpu, m.cpu, m.tier) == (3, 2, 1, TIER_CPU)
        await b.apply_events("a", [IndexEvent(4, IndexRemoved((chain[1],)))])  # tier 0: all tiers
        assert await b.lookup(NS, chain, T0) == {"a": BlockMatch(1, 1)}
        (w,) = await b.workers(with_blocks=True)
        assert (w.indexed_blocks, w.last_seq) == (2, 4)
        await b.apply_events("a", [IndexEvent(5, IndexCleared())])
        assert await b.lookup(NS, chain, T0) == {}
        (w,) = await b.workers(with_blocks=True)
        assert w.indexed_blocks == 0

    run(backend_factory, body)


def test_orphan_stored_event_is_skipped(backend_factory: Callable[[], IndexBackend]) -> None:
    async def body(b: IndexBackend) -> None:
        await b.register(rec("a"))
        chain = H(1, 2, 3)
        res = await b.apply_events("a", [IndexEvent(1, IndexStored((chain[2],), parent=chain[1])),
                                         IndexEvent(2, IndexStored((chain[0],)))])
        assert (res.status, res.applied, res.last_seq) == (ApplyStatus.OK, 2, 2)
        assert (await b.workers(with_blocks=True))[0].indexed_blocks == 1

    run(backend_factory, body)


def test_the_orphan_check_sees_the_batchs_own_changes(
        backend_factory: Callable[[], IndexBackend]) -> None:
    """A parent stored, removed (on every tier it had, or not) or cleared earlier in the
    same batch decides whether a later stored event is an orphan."""
    async def body(b: IndexBackend) -> None:
        await b.register(rec("a"))
        c, d, e = H(1, 2, 3, 4), H(1, 2, 5), H(9, 6)
        await b.apply_events("a", [
            IndexEvent(1, IndexStored(tuple(c[:2]))),
            IndexEvent(2, IndexStored((c[2],), parent=c[1])),                 # parent from event 1
            IndexEvent(3, IndexStored((c[2],), parent=c[1], tier=TIER_CPU)),  # c[2]: GPU and CPU
            IndexEvent(4, IndexRemoved((c[2],), tier=TIER_GPU)),              # CPU copy left
            IndexEvent(5, IndexStored((c[3],), parent=c[2])),                 # so not an orphan
            IndexEvent(6, IndexRemoved((c[1],))),                             # every tier
            IndexEvent(7, IndexStored((d[2],), parent=d[1])),                 # an orphan now
        ])
        m = (await b.lookup(NS, c, T0))["a"]
        assert (m.blocks, m.gpu) == (1, 1)
        assert await b.lookup(NS, [c[0], c[1], d[2]], T0) == {"a": BlockMatch(1, 1)}
        assert (await b.workers(with_blocks=True))[0].indexed_blocks == 3  # c0, c2, c3
        await b.apply_events("a", [
            IndexEvent(8, IndexCleared()),
            IndexEvent(9, IndexStored((c[1],), parent=c[0])),  # c[0]: held before the clear only
            IndexEvent(10, IndexStored((e[0],))),
            IndexEvent(11, IndexStored((e[1],), parent=e[0])),
        ])
        assert await b.lookup(NS, e, T0) == {"a": BlockMatch(2, 2)}
        assert await b.lookup(NS, c[1:], T0) == {}  # c[1] was an orphan
        assert await b.lookup(NS, c, T0) == {}
        assert (await b.workers(with_blocks=True))[0].indexed_blocks == 2

    run(backend_factory, body)


def test_batches_are_atomic_with_seq_checks(backend_factory: Callable[[], IndexBackend]) -> None:
    async def body(b: IndexBackend) -> None:
        await b.register(rec("a"))
        c1, c2 = H(1, 2), H(7, 8)
        ok = await b.apply_events("a", [IndexEvent(1, IndexStored(tuple(c1))),
                                        IndexEvent(2, IndexCleared()),
                                        IndexEvent(3, IndexStored(tuple(c2)))])
        assert (ok.status, ok.applied, ok.last_seq) == (ApplyStatus.OK, 3, 3)
        assert await b.lookup(NS, c1, T0) == {}
        assert await b.lookup(NS, c2, T0) == {"a": BlockMatch(2, 2)}
        gap = await b.apply_events("a", [IndexEvent(5, IndexRemoved(tuple(c2)))])
        assert (gap.status, gap.applied, gap.last_seq) == (ApplyStatus.GAP, 0, 3)
        dup = await b.apply_events("a", [IndexEvent(2, IndexCleared()),
                                         IndexEvent(3, IndexCleared())])
        assert (dup.status, dup.applied) == (ApplyStatus.DUPLICATE, 0)
        unknown = await b.apply_events("zz", [IndexEvent(1, IndexCleared())])
        assert unknown.status is ApplyStatus.UNKNOWN_WORKER

    run(backend_factory, body)


def test_retried_overlapping_batch_applies_only_the_unseen_suffix(
        backend_factory: Callable[[], IndexBackend]) -> None:
    """A publish applied but unanswered is retried with the same first seq plus new events:
    the applied ones are skipped (idempotent by seq), the rest applied, no resync; a batch
    starting past last seq + 1 is still a gap."""
    async def body(b: IndexBackend) -> None:
        await b.register(rec("a"))
        c1, c2, c3 = H(1, 2, 3), H(4, 5), H(6, 7, 8)
        first = [IndexEvent(1, IndexStored(tuple(c1))), IndexEvent(2, IndexRemoved((c1[2],))),
                 IndexEvent(3, IndexStored(tuple(c2)))]
        res = await b.apply_events("a", first)
        assert (res.status, res.applied, res.last_seq) == (ApplyStatus.OK, 3, 3)
        # the retry: events 2..3 again, then new ones that remove and re-add
        retry = [*first[1:], IndexEvent(4, IndexRemoved(tuple(c2))),
                 IndexEvent(5, IndexStored(tuple(c3))),
                 IndexEvent(6, IndexStored((c1[2],), parent=c1[1]))]
        res = await b.apply_events("a", retry)
        assert (res.status, res.applied, res.last_seq) == (ApplyStatus.OK, 3, 6)
        # exactly the model: c1 whole again, c2 gone, c3 held
        assert await b.lookup(NS, c1, T0) == {"a": BlockMatch(3, 3)}
        assert await b.lookup(NS, c2, T0) == {}
        assert await b.lookup(NS, c3, T0) == {"a": BlockMatch(3, 3)}
        (w,) = await b.workers(with_blocks=True)
        assert (w.indexed_blocks, w.last_seq) == (6, 6)
        # an overlap ending in an IndexCleared still clears; the skipped part does nothing
        res = await b.apply_events("a", [IndexEvent(6, IndexRemoved(tuple(c1))),
                                         IndexEvent(7, IndexCleared()),
                                         IndexEvent(8, IndexStored(tuple(c2)))])
        assert (res.status, res.applied, res.last_seq) == (ApplyStatus.OK, 2, 8)
        assert await b.lookup(NS, c1, T0) == {} and await b.lookup(NS, c3, T0) == {}
        assert await b.lookup(NS, c2, T0) == {"a": BlockMatch(2, 2)}
        gap = await b.apply_events("a", [IndexEvent(10, IndexCleared()),
                                         IndexEvent(11, IndexCleared())])
        assert (gap.status, gap.applied, gap.last_seq) == (ApplyStatus.GAP, 0, 8)
        assert await b.lookup(NS, c2, T0) == {"a": BlockMatch(2, 2)}

    run(backend_factory, body)


def test_snapshot_replaces_and_drops_orphans(backend_factory: Callable[[], IndexBackend]) -> None:
    async def body(b: IndexBackend) -> None:
        await b.register(rec("a"))
        old, c1, c2 = H(5, 5), H(1, 2, 3), H(1, 2, 4)
        await b.apply_events("a", [IndexEvent(1, IndexStored(tuple(old)))])
        orphan = H(6, 6)
        snap = [IndexStored((c2[2],), parent=c2[1]),          # listed before its parent chain
                IndexStored(tuple(c1)),
                IndexStored((orphan[1],), parent=orphan[0])]  # parent not in the snapshot
        assert await b.sync_worker("a", 40, snap) == 4
        assert await b.lookup(NS, old, T0) == {}
        assert await b.lookup(NS, c2, T0) == {"a": BlockMatch(3, 3)}
        assert await b.lookup(NS, orphan, T0) == {}
        assert (await b.get_worker("a")).last_seq == 40  # type: ignore[union-attr]
        assert await b.sync_worker("nobody", 1, snap) is None

    run(backend_factory, body)


def test_register_heartbeat_purge(backend_factory: Callable[[], IndexBackend]) -> None:
    async def body(b: IndexBackend) -> None:
        assert not (await b.heartbeat("a", WorkerLoad(), 0, T0)).known
        assert await b.register(rec("a")) is False
        chain = H(1, 2)
        await b.apply_events("a", [IndexEvent(1, IndexStored(tuple(chain)))])
        hb = await b.heartbeat("a", WorkerLoad(running=3, free_blocks=9), 1, T0 + 10)
        assert (hb.known, hb.last_seq, hb.prev_reported_seq) == (True, 1, 0)
        hb = await b.heartbeat("a", WorkerLoad(running=3), 7, T0 + 20)
        assert hb.prev_reported_seq == 1
        w = await b.get_worker("a")
        assert w is not None and (w.load.running, w.heartbeat_ms, w.reported_seq) == (3, T0 + 20, 7)
        # purge only if still silent at the deadline
        assert not await b.purge_worker("a", heartbeat_before_ms=T0 + 20)
        assert await b.purge_worker("a", heartbeat_before_ms=T0 + 21)
        assert await b.get_worker("a") is None and await b.workers() == []
        assert await b.lookup(NS, chain, T0) == {}
        # re-registering (even into another namespace) drops the old state
        await b.register(rec("b"))
        await b.apply_events("b", [IndexEvent(1, IndexStored(tuple(chain)))])
        other = namespace("m2", 4, "sha256_cbor")
        assert await b.register(rec("b", ns=other)) is True
        assert await b.lookup(NS, chain, T0) == {}
        assert (await b.get_worker("b")).ns == other  # type: ignore[union-attr]

    run(backend_factory, body)


def test_measured_costs_round_trip(backend_factory: Callable[[], IndexBackend]) -> None:
    """The worker's measured costs (floats) come back exactly from register and heartbeat,
    next to the integer load fields and the peer-fetch switch (on, then off again)."""
    costs = dict(prefill_us_per_token=123.456789, onboard_us_per_block_cpu=0.1 + 0.2,
                 onboard_us_per_block_disk=1e-7, fetch_us_per_block=0.1 + 0.7,
                 fetch_us_per_call=1234.5678, peer_fetch=True)

    async def body(b: IndexBackend) -> None:
        first = WorkerLoad(running=1, total_blocks=8, **costs)
        await b.register(WorkerRecord("a", NS, "a:1", "m", 4, "sha256_cbor", load=first,
                                      heartbeat_ms=T0))
        assert (await b.get_worker("a")).load == first  # type: ignore[union-attr]
        later = WorkerLoad(running=2, free_blocks=3, total_blocks=8, prefill_us_per_token=7.5,
                           onboard_us_per_block_cpu=2.25, fetch_us_per_block=3e-3)
        assert later.peer_fetch is False
        await b.heartbeat("a", later, 0, T0 + 1)
        assert [w.load for w in await b.workers()] == [later]

    run(backend_factory, body)


# uint64 ids that differ only beyond a double's 53-bit mantissa (Lua numbers are doubles)
OLD_INC, NEW_INC = 2**64 - 1, 2**64 - 2


def test_a_stale_incarnation_is_refused_and_changes_nothing(
        backend_factory: Callable[[], IndexBackend]) -> None:
    async def body(b: IndexBackend) -> None:
        c1, c2 = H(1, 2, 3), H(4, 5)
        await b.register(rec("a", incarnation=OLD_INC))
        await b.apply_events("a", [IndexEvent(1, IndexStored(tuple(c1)))], OLD_INC)
        await b.heartbeat("a", WorkerLoad(running=1), 1, T0 + 1, OLD_INC)
        # the process restarted: a new incarnation registers the same id, seqs from 1 again
        await b.register(rec("a", hb=T0 + 2, incarnation=NEW_INC))
        await b.apply_events("a", [IndexEvent(1, IndexStored(tuple(c2)))], NEW_INC)
        before = await b.get_worker("a")
        # delayed calls of the dead process: all refused, nothing changes
        for call in (b.apply_events("a", [IndexEvent(2, IndexRemoved(tuple(c2))),
                                          IndexEvent(3, IndexStored(tuple(c1)))], OLD_INC),
                     b.apply_events("a", [], OLD_INC),
                     b.heartbeat("a", WorkerLoad(running=9), 5, T0 + 9, OLD_INC),
                     b.sync_worker("a", 7, [IndexStored(tuple(c1))], OLD_INC),
                     b.apply_events("a", [IndexEvent(2, IndexCleared())], 0)):  # no incarnation
            with pytest.raises(StaleIncarnation, match="stale incarnation"):
                await call
        assert await b.get_worker("a") == before
        assert before is not None and before.incarnation == NEW_INC and before.last_seq == 1
        assert await b.lookup(NS, c1, T0) == {}
        assert await b.lookup(NS, c2, T0) == {"a": BlockMatch(2, 2)}
        # the current incarnation goes on
        hb = await b.heartbeat("a", WorkerLoad(), 1, T0 + 10, NEW_INC)
        assert (hb.known, hb.last_seq) == (True, 1)
        assert await b.sync_worker("a", 4, [IndexStored(tuple(c1))], NEW_INC) == 3
        # incarnation 0 (a client without one) matches only a record registered with 0
        await b.register(rec("z"))
        assert (await b.apply_events("z", [IndexEvent(1, IndexStored(tuple(c1)))])).applied == 1
        with pytest.raises(StaleIncarnation):
            await b.heartbeat("z", WorkerLoad(), 1, T0, NEW_INC)

    run(backend_factory, body)


def test_a_stale_batch_racing_a_reregistration_never_lands(
        backend_factory: Callable[[], IndexBackend]) -> None:
    """Register (new incarnation) and a batch of the old one, concurrently: whichever runs
    first, the new incarnation's record ends up holding nothing of the old one's."""
    async def body(b: IndexBackend) -> None:
        chain = H(1, 2)
        for i in range(30):
            old, new = 2 * i + 1, 2 * i + 2
            await b.register(rec("a", incarnation=old))

            async def stale(incarnation: int) -> None:
                with contextlib.suppress(StaleIncarnation):
                    await b.apply_events("a", [IndexEvent(1, IndexStored(tuple(chain)))],
                                         incarnation)

            await asyncio.gather(stale(old), b.register(rec("a", incarnation=new)))
            assert await b.lookup(NS, chain, T0) == {}
            w = await b.get_worker("a")
            assert w is not None and (w.incarnation, w.last_seq) == (new, 0)

    run(backend_factory, body)


def test_provisional_entries_expire(backend_factory: Callable[[], IndexBackend]) -> None:
    async def body(b: IndexBackend) -> None:
        for w in "ab":
            await b.register(rec(w))
        chain = H(1, 2, 3, 4)
        await b.apply_events("a", [IndexEvent(1, IndexStored(tuple(chain[:2])))])
        await b.add_provisional(NS, chain, "a", 2, T0, 2000)
        await b.add_provisional(NS, chain, "b", 0, T0 + 500, 2000)
        assert await b.lookup(NS, chain, T0 + 1000) == {"a": BlockMatch(4, 4),
                                                        "b": BlockMatch(4, 4)}
        # a's provisional blocks expire at T0 + 2000, b's at T0 + 2500
        assert await b.lookup(NS, chain, T0 + 2000) == {"a": BlockMatch(2, 2),
                                                        "b": BlockMatch(4, 4)}
        assert await b.lookup(NS, chain, T0 + 2500) == {"a": BlockMatch(2, 2)}
        # never counted as holdings
        assert [w.indexed_blocks for w in await b.workers(with_blocks=True)] == [2, 0]

    run(backend_factory, body)


def test_resolve_snapshot_handles_cycles() -> None:
    a, b2 = H(1)[0], H(2)[0]
    got = resolve_snapshot([IndexStored((a,), parent=b2), IndexStored((b2,), parent=a)])
    assert got == {}


def test_tenant_quotas_are_set_replaced_and_cleared_per_tenant(
        backend_factory: Callable[[], IndexBackend]) -> None:
    """Quotas start empty; a set replaces one tenant's quota (the default's with '*'), a
    clear removes it; tenants set at once, each in its own write, are all kept."""
    async def body(b: IndexBackend) -> None:
        assert await b.quotas() == Quotas()
        got = await b.set_quota(ALL_TENANTS, Quota(gpu=0.8))
        assert got == Quotas(Quota(gpu=0.8)) == await b.quotas()
        await asyncio.gather(*(b.set_quota(t, Quota(gpu=0.1 * i, disk=0.5))
                               for i, t in enumerate("abcd")))
        await b.set_quota("b", Quota(cpu=0.25))  # replaces b's whole quota
        want = Quotas(Quota(gpu=0.8), {"a": Quota(gpu=0.0, disk=0.5),
                                       "b": Quota(cpu=0.25),
                                       "c": Quota(gpu=0.2, disk=0.5),
                                       "d": Quota(gpu=0.1 * 3, disk=0.5)})
        assert await b.quotas() == want and want.version != 0
        assert (await b.set_quota("c", None)).tenants.keys() == {"a", "b", "d"}
        await b.set_quota(ALL_TENANTS, None)
        for t in "abd":
            await b.set_quota(t, Quota())  # empty: removed too
        assert await b.quotas() == Quotas() and (await b.quotas()).version == 0

    run(backend_factory, body)
