"""Hand-packed waves over a real 3-primary Redis Cluster (``service/index/nodes.py``): a
wave cancelled at any point leaves no connection pooled with unread replies."""
from __future__ import annotations

import asyncio
import contextlib

import pytest

from service.index.base import BlockMatch, IndexEvent, IndexStored
from service.index.cluster import ClusterBackend
from tests.reliability.test_index_cluster_split import run
from tests.service.index.test_base import NS, T0, H, rec

pytestmark = [pytest.mark.integration, pytest.mark.cluster_layout]


def test_a_wave_cancelled_anywhere_leaves_every_connection_clean(
        redis_cluster_url: str) -> None:
    chain, other = H(21, *range(40)), H(22, *range(30))

    async def body(b: ClusterBackend) -> None:
        await b.register(rec("w"))
        await b.apply_events("w", [IndexEvent(1, IndexStored(tuple(chain)))])
        await b.add_provisional(NS, other, "w", 0, T0, 60_000)
        prompts = [chain, other, H(23, 1, 2), chain[:7]]
        want = [await b.lookup(NS, p, T0) for p in prompts]
        assert want[0] == {"w": BlockMatch(41, 41)} and want[2] == {}
        cut = 0
        for k in range(24):  # cancelled after 0..7 turns of the loop: while sending, reading
            task = asyncio.ensure_future(b.lookup(NS, prompts[k % 2], T0))
            for _ in range(k % 8):
                await asyncio.sleep(0)
            cut += task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            # a connection pooled with the cancelled wave's replies would shift these (the
            # pool hands connections out in turn: every one is used)
            for _ in range(3):
                assert [await b.lookup(NS, p, T0) for p in prompts] == want
        assert cut >= 12  # most were cut midway, not after they ended

    run(redis_cluster_url, body)
