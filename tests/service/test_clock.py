"""The servicer reads time only from its injected clock: the degraded period and the forced
refresh's throttle follow a ManualClock, with no sleeping."""
from __future__ import annotations

import asyncio

from service.config import ServiceConfig
from service.index.memory import MemoryBackend
from service.servicer import IndexServicer
from tests.service.manual_clock import ManualClock


class CountingReads(MemoryBackend):
    """A memory index that counts full reads of the worker records."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def workers(self, with_blocks: bool = False):  # type: ignore[no-untyped-def]
        self.reads += 1
        return await super().workers(with_blocks)


def test_the_degraded_period_lasts_degraded_retry_s_of_the_clock() -> None:
    clock = ManualClock()
    s = IndexServicer(ServiceConfig(degraded_retry_s=0.5), MemoryBackend(), clock).router
    assert not s.index_down
    s.mark_down()
    clock.advance(499)
    assert s.index_down
    clock.advance(1)
    assert not s.index_down
    s.mark_down()
    s.mark_up()                 # a successful refresh ends it at once
    assert not s.index_down


def test_a_route_finding_no_worker_refreshes_at_most_every_forced_refresh_min_s() -> None:
    async def main() -> None:
        clock = ManualClock()
        backend = CountingReads()
        s = IndexServicer(ServiceConfig(forced_refresh_min_s=0.05), backend, clock).router
        assert await s._forced_refresh(clock()) and backend.reads == 1
        clock.advance(49)
        assert not await s._forced_refresh(clock()) and backend.reads == 1   # throttled
        clock.advance(1)
        assert await s._forced_refresh(clock()) and backend.reads == 2

    asyncio.run(main())
