"""The index link's contract, against both of its adapters (a kvmesh worker, a bridge rank):
register, heartbeat, publish (halving refused batches), resync (after registration, a gap,
an overflow, a quiet heartbeat's answer; never for an answer that raced a publish: that one
is rechecked soon), register again when forgotten, one incarnation on every call, the next
service address when one fails, heartbeats from a thread of their own."""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import pytest

from kvmesh.link import BeatThread, Link
from tests.kvmesh.link.fake_index import FakeIndex, serving
from tests.kvmesh.link.sides import BS, SIDES, truth
from tests.ports import free_port


@pytest.fixture(params=sorted(SIDES))
def side(request):
    s = SIDES[request.param]()
    yield s
    s.close()


@contextlib.asynccontextmanager
async def running(link: Link):
    task = asyncio.create_task(link.run())
    try:
        yield link
    finally:
        await link.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def until(ok: Callable[[], bool], state: Callable[[], object] = lambda: None,
                within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while not ok():
        assert time.monotonic() < deadline, f"not within the time: {state()}"
        await asyncio.sleep(0.01)


async def exact(index: FakeIndex, link: Link, within: float = 15.0) -> None:
    """Wait until the index holds what the side holds and the link owes it nothing (so
    its counters count every call the index answered)."""
    deadline = time.monotonic() + within
    while True:
        seq, blocks = await truth(link)
        if index.last_seq == seq and index.view == blocks and link.settled:
            return
        assert time.monotonic() < deadline, (index.last_seq, seq, len(index.view), len(blocks))
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def linked(side, index: FakeIndex, *, dead: int = 0, beats: BeatThread | None = None,
                 **opts):
    """``side``'s link to ``index`` (after ``dead`` addresses nobody answers), registered,
    synced and exact after a first round of events."""
    async with serving(index) as address:
        link = side.make([*(f"127.0.0.1:{free_port()}" for _ in range(dead)), address], **opts)
        link.beats = beats
        async with running(link):
            await until(lambda: link.registered and link.counters["resyncs"] == 1)
            await side.produce(0)
            await exact(index, link)
            yield link


def test_registers_syncs_and_publishes_until_the_index_is_exact(side) -> None:
    async def main():
        index = FakeIndex()
        async with linked(side, index) as link:
            await until(lambda: link.counters["heartbeats"] >= 2)
            (reg,) = index.of("RegisterWorker")
            assert reg.model == "tiny" and reg.block_size == BS and reg.worker_id == "w0"
            assert reg.incarnation == link.incarnation != 0
            for method in ("Heartbeat", "PublishEvents", "SyncWorker"):
                assert {r.incarnation for r in index.of(method)} == {link.incarnation}
            assert len(index.view) == 20 and index.last_seq == side.seq
            assert link.counters["resyncs"] == 1 and link.counters["gaps"] == 0
    asyncio.run(main())


def test_a_batch_over_the_service_limit_is_halved_not_resynced(side) -> None:
    async def main():
        index = FakeIndex()
        async with linked(side, index) as link:
            index.bad.max_batch_events = 4
            await side.produce(1, n=20)
            await exact(index, link)
            assert link.counters["refused"] >= 1 and link.limits.events <= 4
            assert link.counters["resyncs"] == 1 and link.counters["gaps"] == 0
    asyncio.run(main())


def test_a_lost_batch_is_noticed_and_replaced_by_a_snapshot(side) -> None:
    async def main():
        index = FakeIndex()
        async with linked(side, index) as link:
            link.drop_next_batch = True  # the next batch is lost in transit
            await side.produce(1)
            await until(lambda: not link.backlog)  # gone, the index none the wiser
            await side.produce(2)
            await until(lambda: link.counters["gaps"] == 1 and link.counters["resyncs"] == 2,
                        lambda: dict(link.counters))
            await exact(index, link)
    asyncio.run(main())


def test_a_resync_answer_racing_a_publish_is_rechecked_not_obeyed(side) -> None:
    """Heartbeats every 0.5 s, each publish held 0.6 s: every publish overlaps a beat, whose
    answer asks for a resync. The link neither obeys it (one resync only, at registration)
    nor waits a whole interval: it beats again soon to recheck."""
    async def main():
        index = FakeIndex(heartbeat_ms=500)
        async with linked(side, index) as link:
            index.bad.beat_resync_in_flight = True
            index.bad.publish_delay_s = 0.6
            for r in range(1, 4):
                await side.produce(r, n=2)
                await exact(index, link)
            assert link.counters["beat_resync_deferred"] >= 1
            assert link.counters["resyncs"] == 1 and link.counters["gaps"] == 0
            beats = index.times("Heartbeat")
            assert min(b - a for a, b in zip(beats, beats[1:], strict=False)) < 0.3
    asyncio.run(main())


@pytest.mark.parametrize("answer", ["resync_next_beat", "reregister_next_beat"])
def test_an_index_that_lost_the_worker_gets_a_snapshot(side, answer: str) -> None:
    """A quiet heartbeat's resync answer is obeyed; a worker the service forgot registers
    again (same incarnation) and resyncs."""
    async def main():
        index = FakeIndex()
        async with linked(side, index) as link:
            index.view.clear()  # the index lost the worker's blocks
            setattr(index.bad, answer, True)
            await until(lambda: link.counters["resyncs"] == 2)
            await exact(index, link)
            assert len(index.view) == 20
            assert link.counters["registrations"] == (2 if "reregister" in answer else 1)
            assert {r.incarnation for r in index.of("RegisterWorker")} == {link.incarnation}
    asyncio.run(main())


def test_an_unreachable_service_address_is_left_for_the_next(side) -> None:
    async def main():
        index = FakeIndex()
        async with linked(side, index, dead=1) as link:
            assert link.conn.ring.current == link.conn.ring.addresses[1]
            assert link.counters["error_unavailable"] >= 1
    asyncio.run(main())


def test_an_overflowing_backlog_is_dropped_for_a_snapshot(side) -> None:
    async def main():
        index = FakeIndex()
        bound = 30
        async with linked(side, index, max_pending=bound) as link:
            index.bad.publish_delay_s = 0.5  # the index falls behind
            for r in range(1, 6):
                await side.produce(r)
                assert link.backlog.blocks <= bound
            assert link.counters["overflows"] >= 1
            index.bad.publish_delay_s = 0.0
            await exact(index, link)
            assert link.counters["resyncs"] >= 2 and len(index.view) == 6 * 20
    asyncio.run(main())


def test_heartbeats_run_from_a_beat_thread_with_their_own_channel(side) -> None:
    async def main():
        index, beats = FakeIndex(), BeatThread().start()
        try:
            async with linked(side, index, beats=beats) as link:
                await until(lambda: link.counters["heartbeats"] >= 3)
                assert link.beat_conn is not None and link.beat_conn is not link.conn
        finally:
            await asyncio.to_thread(beats.stop)
    asyncio.run(main())
