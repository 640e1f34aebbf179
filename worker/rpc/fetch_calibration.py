"""Seed a worker's peer-fetch costs at start: a loopback offer/pull through its own data plane.

Without it the router prices a worker's fetches by ``service.policy.fetch``'s defaults until
that worker has received a real fetch, and on a fresh cluster a route may then never plan
one (or plan one that loses). So a worker with peer fetch on measures, before it registers:

- ``fetch_us_per_block``: the pull of about ``TARGET_BYTES`` of blocks of its real block
  size (zeros, its own layout; 2 to ``MAX_BLOCKS`` blocks) over its default transport minus
  the pull of one, per extra block (each block copied into a receive buffer, as a live
  fetch's sink does);
- ``fetch_us_per_call``: what a fetch costs before its bytes flow, i.e. the pull of one block
  less one block's share, plus one hop onto the engine thread and back (a live header waits
  for the source's snapshot there).

Each is the fastest of ``REPS`` runs after a warm-up (the data plane's first connection is
not a fetch's cost), the one-block and the many-block pulls interleaved so that a burst of
load on a shared host hits both alike. It takes well under 0.5 s; live fetches then move the
averages (``worker.engine.costs.CostMeter.fetch``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from kvmesh.transfer.transports import DEFAULT_TRANSPORT, pull
from worker.engine.async_engine import AsyncEngine
from worker.engine.peer_blocks import layout
from worker.rpc.fetch_call import PeerSource

TARGET_BYTES = 1 << 20  # the many-block pull: enough bytes that they, not the call, dominate
MAX_BLOCKS = 32
REPS = 5
TIMEOUT_S = 5.0


@dataclass(frozen=True)
class FetchCalibration:
    """The seeded figures, in microseconds."""

    us_per_call: float
    us_per_block: float


async def _roundtrip(source: PeerSource, blocks: list[memoryview], into: bytearray,
                     transport: str) -> float:
    """Seconds to offer ``blocks`` and pull them back into ``into``."""
    size = len(blocks[0])
    view = memoryview(into)

    def sink(i: int, block: memoryview) -> None:
        view[i * size:(i + 1) * size] = block

    t0 = time.perf_counter()
    endpoint = (await source.data_server()).offer(transport, blocks, TIMEOUT_S)
    await pull(endpoint, size, len(blocks), sink, TIMEOUT_S)
    return time.perf_counter() - t0


async def calibrate(source: PeerSource, runner: AsyncEngine,
                    transport: str = DEFAULT_TRANSPORT) -> FetchCalibration:
    """Measure (see the module docstring) and seed ``runner``'s cost meter, on its engine
    thread. Starts ``source``'s data plane (it stays up, as after a first fetch served)."""
    block_bytes = (await runner.call(layout)).block_bytes
    n = max(2, min(MAX_BLOCKS, TARGET_BYTES // block_bytes))
    buf = bytearray(n * block_bytes)
    blocks = [memoryview(buf)[i * block_bytes:(i + 1) * block_bytes] for i in range(n)]
    into = bytearray(n * block_bytes)
    await _roundtrip(source, blocks, into, transport)  # warm-up: connections, allocations
    one = many = float("inf")
    for _ in range(REPS):
        one = min(one, await _roundtrip(source, blocks[:1], into, transport))
        many = min(many, await _roundtrip(source, blocks, into, transport))

    async def hop() -> float:
        t0 = time.perf_counter()
        await runner.call(lambda e: None)
        return time.perf_counter() - t0

    per_block = max(many - one, 0.0) / (n - 1)
    per_call = max(one - per_block, 0.0) + min([await hop() for _ in range(REPS)])
    # a per-block cost below a microsecond is noise: keep it positive (0.0 means unknown)
    result = FetchCalibration(per_call * 1e6, max(per_block * 1e6, 1.0))

    def seed(engine) -> None:
        engine.costs.fetch_us_per_call = result.us_per_call
        engine.costs.fetch_us_per_block = result.us_per_block

    await runner.call(seed)
    return result
