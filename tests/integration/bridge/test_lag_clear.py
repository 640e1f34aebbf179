"""Bounded staleness against real processes: an engine flooding faster than the bridge can
apply, with a removal in the backlog, stops being claimed for the removed blocks within the
liveness timeout, stays registered, and indexes normally once the flood is over."""
from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest

from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc as pb_grpc
from tests.bridge.cluster import Engine, Running, chain, removed, router
from tests.integration.bridge.test_overload import Watch, spin, tokens

pytestmark = pytest.mark.integration


class Claims:
    """Polls a dry-run ``Route`` from its own thread (the test's loop is the busy one):
    ``(monotonic time, tokens the worker matches)`` for one prompt."""

    def __init__(self, address: str, prompt: list[int], model: str, worker_id: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.IndexServiceStub(self.channel)
        self.req = pb.RouteRequest(token_ids=[*prompt, 0], model=model, dry_run=True)
        self.worker_id = worker_id
        self.samples: list[tuple[float, int]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Claims:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._done.wait(0.05):
            resp = self.stub.Route(self.req, timeout=5)
            got = {c.worker_id: c.matched_tokens for c in resp.candidates}
            self.samples.append((time.monotonic(), got.get(self.worker_id, 0)))

    def stop(self) -> Claims:
        self._done.set()
        self._thread.join(10)
        self.channel.close()
        return self

    def last_claimed(self) -> float:
        return max(t for t, m in self.samples if m > 0)


def test_a_flood_past_capacity_never_over_claims_a_removal_longer_than_liveness(
        service: str) -> None:
    """Each batch costs the bridge 50 ms (the GIL held); the engine publishes about ten times
    that rate, each batch a fresh block and the removal of an older one. A second into the
    flood the engine drops a three-block chain; without a bound its removal would wait behind
    seconds of backlog while heartbeats keep the engine routable."""
    async def main():
        e = Engine("behind", "m-behind")
        async with Running(service, [e.spec]) as br, router(service) as r:
            rank = br.ranks["behind"]
            link, sub = rank.link, rank.sub
            await br.live("behind", e.pub)
            e.pub.publish(chain(tokens(0, 3)))  # engine hashes 1, 2, 3
            await r.until(lambda: r.matched(tokens(0, 3), "m-behind"),
                          lambda m: m.get("behind") == 12)
            ingest = rank.state.ingest_parts

            def slow(seq: int, payload: bytes):
                spin(0.05)
                return ingest(seq, payload)
            rank.state.ingest_parts = slow
            claims = Claims(service, tokens(0, 3), "m-behind", "behind").start()
            watch = Watch(service, "behind").start()
            loop = asyncio.get_running_loop()
            start = loop.time()
            dropped_at = None
            i = 0
            while loop.time() < start + 6.0:
                for _ in range(10):
                    i += 1
                    events = [chain(tokens(i, 1), first=100 + i)]
                    if i > 8:
                        events.append(removed([100 + i - 8]))
                    e.pub.publish(*events)
                if dropped_at is None and loop.time() > start + 1.0:
                    e.pub.publish(removed([1, 2, 3]))
                    dropped_at = time.monotonic()
                await asyncio.sleep(0.01)
            claims.stop()
            assert dropped_at is not None
            assert claims.samples[-1][0] > dropped_at + link.liveness_s  # watched long enough
            assert claims.last_claimed() - dropped_at < link.liveness_s, (
                claims.last_claimed() - dropped_at, sub.stats)
            assert sub.stats.lag_clears >= 1 and sub.stats.skipped > 0
            rank.state.ingest_parts = ingest
            # after the flood: a new chain is indexed (the first batch after a skip is FIRST)
            e.pub.publish(chain(tokens(9999, 3), first=50_000))
            await r.until(lambda: r.matched(tokens(9999, 3), "m-behind"),
                          lambda m: m.get("behind") == 12)
            watch.stop()
            assert watch.dead == 0, (watch.dead, watch.samples)
            assert link.counters["registrations"] == 1
            assert (await r.matched(tokens(0, 3), "m-behind")).get("behind", 0) == 0
            assert rank.state.expected == e.pub.seq
        await e.close()
    asyncio.run(main())
