"""Bounded staleness, subscriber level: a backlog with removals past ``max_lag_s`` clears the
engine and is skipped; one of stores only is applied; a skewed or stepping engine clock is
not lag (see ``bridge.subscriber`` and ``bridge.lag``)."""
from __future__ import annotations

import asyncio
import time

import pytest

from bridge.lag import Lag
from kvmesh.events import vllm as ve
from tests.bridge.fake_vllm import FakeEngine
from tests.bridge.test_subscriber import Bridge, chain_of, ports, root, urls


def publish_at(engine: FakeEngine, ts: float, *events: ve.VllmEvent) -> int:
    """``engine.publish`` with the engine's clock reading ``ts``."""
    seq, engine.seq = engine.seq, engine.seq + 1
    payload = ve.encode_batch(ve.KVEventBatch(ts=ts, events=list(events),
                                              data_parallel_rank=0))
    engine.buffer.append((seq, payload))
    engine.pub.send_multipart(ve.pack_message(engine.topic, seq, payload))
    return seq


def slowed(b: Bridge, seconds: float) -> None:
    """Every batch the state ingests takes ``seconds`` more (the loop held, as a saturated
    bridge holds it)."""
    ingest = b.state.ingest_parts

    def slow(seq: int, payload: bytes):
        until = time.perf_counter() + seconds
        while time.perf_counter() < until:
            pass
        return ingest(seq, payload)
    b.state.ingest_parts = slow


def test_a_backlog_with_a_removal_past_the_bound_clears_and_resumes_from_the_newest() -> None:
    async def main():
        pub, rep = ports()
        engine = FakeEngine(pub, rep)
        async with Bridge(*urls(pub, rep), probe_interval=None, max_lag_s=0.2) as b:
            await b.live(engine)
            engine.publish(root(1, 1))
            await b.until(lambda: chain_of(1) in b.holds())
            slowed(b, 0.05)
            for n in range(2, 12):  # 0.5 s of work queued at once: the last is 0.45 s late
                engine.publish(root(n, n))
            engine.publish(ve.VllmRemoved(block_hashes=[1], medium=None))
            for n in range(12, 16):
                engine.publish(root(n, n))
            await b.until(lambda: b.stats.lag_clears == 1)
            assert b.index.cleared == 1
            assert b.stats.skipped >= 1
            # the clear came at the bound, not after the whole backlog: chains published
            # behind the removal were skipped, never applied
            assert chain_of(15) not in b.holds() and chain_of(1) not in b.holds()
            await b.until(lambda: b.state.expected is None or b.state.expected == engine.seq)
            engine.publish(root(20, 20))  # resumes: FIRST after the clear
            await b.until(lambda: b.holds() == {chain_of(20)})
            assert b.state.expected == engine.seq
            assert b.stats.lag_clears == 1 and b.stats.gaps == 0
        await engine.close()
    asyncio.run(main())


@pytest.mark.slow
def test_a_backlog_of_stores_only_is_applied_whole_however_late() -> None:
    async def main():
        pub, rep = ports()
        engine = FakeEngine(pub, rep)
        async with Bridge(*urls(pub, rep), probe_interval=None, max_lag_s=0.2) as b:
            await b.live(engine)
            slowed(b, 0.05)
            for n in range(1, 16):
                engine.publish(root(n, n))
            await b.until(lambda: b.state.expected == engine.seq)
            assert b.holds() == {chain_of(n) for n in range(1, 16)}
            assert b.stats.lag_clears == 0 and b.index.cleared == 0
            assert b.sub.lag is not None and b.sub.lag.age > 0.2  # it was behind
        await engine.close()
    asyncio.run(main())


@pytest.mark.slow
def test_a_skewed_engine_clock_is_not_lag_and_a_step_back_costs_one_clear() -> None:
    async def main():
        pub, rep = ports()
        engine = FakeEngine(pub, rep)
        skew = [-100.0]  # the engine's clock runs 100 s behind the bridge's

        def send(*events: ve.VllmEvent, drop: bool = False) -> int:
            return publish_at(engine, time.time() + skew[0], *events)
        engine.publish = send  # every batch, the probes of b.live() too

        async with Bridge(*urls(pub, rep), probe_interval=None, max_lag_s=0.5) as b:
            await b.live(engine)
            for n in range(1, 6):  # removals applied promptly, 100 s "old" by the clocks
                send(root(n, n))
                send(ve.VllmRemoved(block_hashes=[n], medium=None))
                await b.until(lambda: b.state.expected == engine.seq)
            send(root(6, 6))
            await b.until(lambda: b.holds() == {chain_of(6)})
            assert b.stats.lag_clears == 0
            skew[0] -= 60  # the engine's clock steps a minute back
            slowed(b, 0.05)  # so that the removal queues while the batch before it applies
            send(root(7, 7))
            send(ve.VllmRemoved(block_hashes=[6], medium=None))
            await b.until(lambda: b.stats.lag_clears == 1)  # looks like lag, once
            for n in range(8, 12):
                send(root(n, n))
                send(ve.VllmRemoved(block_hashes=[n - 1], medium=None))
                await b.until(lambda: b.state.expected == engine.seq)
            assert b.holds() == {chain_of(11)}
            assert b.stats.lag_clears == 1
            assert b.sub.lag is not None and b.sub.lag.rebases == 1
        await engine.close()
    asyncio.run(main())


def test_the_age_is_growth_over_the_smallest_offset() -> None:
    bound = [1.0]
    lag = Lag(lambda: bound[0], "e")
    assert lag.observe(ts=50.0, now=150.0) == 0.0  # skew 100 s: the baseline
    assert lag.observe(ts=51.0, now=151.5) == 0.5 and not lag.behind
    assert lag.observe(ts=52.0, now=153.5) == 1.5 and lag.behind
    bound[0] = 2.0  # the bound is read afresh (the link learns the liveness timeout)
    assert lag.observe(ts=53.0, now=154.5) == 1.5 and not lag.behind
    assert lag.observe(ts=60.0, now=155.0) == 0.0  # the engine's clock stepped forward
    assert lag.baseline == 95.0
    lag.cleared(skipped=3)
    assert lag.observe(ts=40.0, now=156.0) == 0.0 and lag.rebases == 1  # stepped back
    assert lag.observe(ts=41.0, now=157.0) == 0.0 and lag.rebases == 1
