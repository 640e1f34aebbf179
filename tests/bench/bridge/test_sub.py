"""``python -m bench.bridge.sub``: real subscribers apply the whole load over TCP, and the
loop's CPU splits into the ingest and the rest."""
from __future__ import annotations

import asyncio

from bench.bridge.ingest import payloads
from bench.bridge.sub import run


def test_every_batch_is_applied_and_timed() -> None:
    work = payloads(40, engines=2, blocks=4, block_size=4, window=3)
    row = asyncio.run(run(work, engines=2, block_size=4))
    assert row["stored_blocks"] == 40 * 4 and row["malformed"] == row["gaps"] == 0
    assert row["loop_us_per_block"] >= row["ingest_us_per_block"] > 0
