"""The bridge past capacity: a busy ingest loop and a slow index, against real processes.

A bridge (``Running``, in the test's loop) feeds a service process on Valkey. Capacity is
taken away by injection: every batch the engine state ingests burns CPU (the GIL held, as a
saturated bridge holds it), or the service's ``PublishEvents`` answers slowly. What must
hold: the engine stays live throughout (a thread polls the service's ``Stats``), it never
registers again, the pending events stay bounded, and once the flood is over the index
answers exactly what the engine holds.
"""
from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest

from kvmesh.link.backlog import BatchLimits
from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc as pb_grpc
from tests.bridge.cluster import BS, Engine, Running, chain, removed, router

pytestmark = pytest.mark.integration


class Watch:
    """Polls ``Stats`` from its own thread (the test's loop is the busy one): how often the
    worker was seen dead once it had been seen alive."""

    def __init__(self, address: str, worker_id: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.IndexServiceStub(self.channel)
        self.worker_id = worker_id
        self.samples = self.dead = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Watch:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._done.wait(0.1):
            resp = self.stub.Stats(pb.StatsRequest(), timeout=5)
            alive = {w.worker_id: w.alive for w in resp.workers}
            self.samples += 1
            self.dead += not alive.get(self.worker_id, False)

    def stop(self) -> Watch:
        self._done.set()
        self._thread.join(10)
        self.channel.close()
        return self


def spin(seconds: float) -> None:
    """Busy CPU, holding the GIL between the interpreter's forced switches."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def tokens(i: int, blocks: int) -> list[int]:
    """Chain ``i``'s prompt: tokens no other chain shares."""
    return [5000 + i * blocks * BS + k for k in range(blocks * BS)]


async def applied(rank, engine) -> None:
    """Wait until the rank's state applied everything the engine published and the link
    has nothing left to send."""
    async def probe():
        await asyncio.sleep(0.05)
        return (rank.state.expected, len(rank.link.pending), rank.link.need_sync)
    from deploy.waiting import eventually
    await eventually(probe, lambda p: p == (engine.seq, 0, False), within=60)


def test_a_saturated_ingest_loop_keeps_the_engine_live(service: str) -> None:
    """Each batch holds the ingest loop 1.2 s: a heartbeat waiting for the loop would need
    several turns and miss the 3 s liveness timeout; the beat thread's do not."""
    async def main():
        e = Engine("busy", "m-busy")
        async with Running(service, [e.spec]) as br, router(service) as r:
            rank = br.ranks["busy"]
            await br.live("busy", e.pub)
            e.pub.publish(chain(tokens(0, 3)))
            await r.until(lambda: r.matched(tokens(0, 3), "m-busy"),
                          lambda m: m.get("busy") == 12)
            ingest = rank.state.ingest_parts

            def slow(seq: int, payload: bytes):
                spin(1.2)
                return ingest(seq, payload)
            rank.state.ingest_parts = slow
            beats, watch = rank.link.counters["heartbeats"], Watch(service, "busy").start()
            for i in range(1, 8):
                e.pub.publish(chain(tokens(i, 3), first=10 * i))
            await applied(rank, e.pub)
            watch.stop()
            rank.state.ingest_parts = ingest
            assert watch.dead == 0, (watch.dead, watch.samples)
            assert watch.samples >= 20
            assert rank.link.counters["heartbeats"] - beats >= 6
            assert rank.link.counters["registrations"] == 1
            for i in range(8):
                await r.until(lambda i=i: r.matched(tokens(i, 3), "m-busy"),
                              lambda m: m.get("busy") == 12)
        await e.close()
    asyncio.run(main())


class SlowPublish:
    """A service stub whose PublishEvents answers ``delay`` seconds late."""

    def __init__(self, stub, delay: float) -> None:
        self._stub, self._delay = stub, delay

    def __getattr__(self, name: str):
        return getattr(self._stub, name)

    async def PublishEvents(self, req, **kw):  # noqa: N802 - gRPC's name
        await asyncio.sleep(self._delay)
        return await self._stub.PublishEvents(req, **kw)


def test_a_slow_index_sheds_the_backlog_for_snapshots_and_ends_exact(service: str) -> None:
    """A flood of 3,000 batches (a fresh two-block chain each, and the removal of the chain
    16 batches older) against an index taking 0.3 s per PublishEvents of at most 64 events:
    queued, the backlog would hold most of the flood; shed for snapshots it stays a few
    intervals' worth, and the index ends holding exactly the engine's last 16 chains."""
    n, window = 3000, 16

    async def main():
        e = Engine("flood", "m-flood")
        async with Running(service, [e.spec]) as br, router(service) as r:
            rank = br.ranks["flood"]
            link = rank.link
            await br.live("flood", e.pub)
            await r.until(r.alive, lambda a: a.get("flood") is True)
            link.limits = BatchLimits(64, 256)
            link.shed_interval_s = 0.2
            stub = link.conn.stub
            link.conn.stub = lambda: SlowPublish(stub(), 0.3)
            peak, weight, add = [0], [0], link.pending.add

            def counted(events, after=0):
                weight[0] += sum(1 + link.pending.hashes(ev) for ev in events)
                ok = add(events, after)
                peak[0] = max(peak[0], link.pending.blocks)
                return ok
            link.pending.add = counted
            watch = Watch(service, "flood").start()
            for i in range(n):
                events = [chain(tokens(i, 2), first=10 + 2 * i)]
                if i >= window:
                    j = i - window
                    events.append(removed([10 + 2 * j, 11 + 2 * j]))
                e.pub.publish(*events)
                if i % 50 == 49:
                    await asyncio.sleep(0.05)
            await applied(rank, e.pub)
            watch.stop()
            assert peak[0] < weight[0] / 4, (peak[0], weight[0])
            assert link.counters["sheds"] >= 1
            assert link.counters["registrations"] == 1 and watch.dead == 0
            assert rank.state.indexed_blocks == 2 * window
            for i in range(n - window, n):  # the engine's truth: its last chains, whole
                await r.until(lambda i=i: r.matched(tokens(i, 2), "m-flood"),
                              lambda m: m.get("flood") == 8)
            for i in (0, n // 2, n - window - 1):  # and none of the removed ones
                assert (await r.matched(tokens(i, 2), "m-flood")).get("flood") == 0
        await e.close()
    asyncio.run(main())


def test_a_blocked_index_takes_the_engine_out_of_routing_until_it_acknowledges(
        service: str) -> None:
    """Heartbeats from their own thread must not keep a stale index routable: while a
    removal waits for an index that acknowledges nothing, the engine leaves routing within
    two liveness timeouts; once the index answers it is back, without the removed blocks
    and without registering again."""
    async def main():
        e = Engine("stuck", "m-stuck")
        async with Running(service, [e.spec]) as br, router(service) as r:
            rank = br.ranks["stuck"]
            await br.live("stuck", e.pub)
            e.pub.publish(chain(tokens(0, 3)))
            await r.until(lambda: r.matched(tokens(0, 3), "m-stuck"),
                          lambda m: m.get("stuck") == 12)
            # The link's stub is made to block, not replaced: a publish loop still under way
            # (the chain's answer came, the loop not yet ended) holds it and would send the
            # removal through a replacement's predecessor.
            gate, stub = asyncio.Event(), rank.link.conn.stub()
            publish = stub.PublishEvents

            async def blocked(req, **kw):
                await gate.wait()
                return await publish(req, **kw)
            stub.PublishEvents = blocked
            e.pub.publish(removed([2, 3]))  # the engine keeps 1 block of 3
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await r.until(r.alive, lambda a: a.get("stuck") is False)
            assert loop.time() - t0 < 2 * 3.0 + 1.0 + 1.0  # two timeouts, a beat, a refresh
            assert rank.link.counters["stale_beats"] > 0
            gate.set()
            await r.until(lambda: r.matched(tokens(0, 3), "m-stuck"),
                          lambda m: m.get("stuck") == 4)
            assert rank.link.counters["registrations"] == 1
        await e.close()
    asyncio.run(main())
