"""The start calibration of peer-fetch costs: a loopback offer/pull through the worker's own
data plane seeds its cost meter (reported with its load), quickly, and the data plane stays
up for real fetches."""
from __future__ import annotations

import asyncio
import time

import pytest

from kvmesh.transfer.transports import pull
from tests.worker.rpc.peers import BS
from worker import Engine
from worker.engine.async_engine import AsyncEngine
from worker.model import load_model
from worker.rpc import fetch_calibration
from worker.rpc.fetch_call import PeerSource
from worker.rpc.peer_stats import PeerCounters


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


async def _calibrated(tiny, transport: str = "zmq"):
    model, cfg = tiny
    runner = AsyncEngine(Engine(model, cfg, block_size=BS, num_blocks=32)).start()
    source = PeerSource(runner, credential="cred", enabled=True, host="127.0.0.1",
                        counters=PeerCounters())
    try:
        assert runner.engine.load()["fetch_us_per_block"] == 0.0  # unknown before
        t0 = time.perf_counter()
        got = await fetch_calibration.calibrate(source, runner, transport)
        took = time.perf_counter() - t0
        load = await runner.call(lambda e: e.load())
        # the data plane stays up: a real offer after the calibration is pulled as usual
        data = await source.data_server()
        block = bytes(range(256)) * 4
        seen: list[bytes] = []
        n = await pull(data.offer(transport, [block, block]), len(block), 2,
                       lambda i, b: seen.append(bytes(b)), 5.0)
        return got, took, load, n, seen, block
    finally:
        await source.close()
        runner.stop()


@pytest.mark.parametrize("transport", ["zmq", "grpc"])
def test_calibration_seeds_the_fetch_costs_the_load_reports(tiny, transport):
    got, took, load, n, seen, block = asyncio.run(_calibrated(tiny, transport))
    assert got.us_per_call > 0 and got.us_per_block >= 1.0
    assert load["fetch_us_per_call"] == got.us_per_call
    assert load["fetch_us_per_block"] == got.us_per_block
    assert took < 0.5, f"the calibration took {took:.3f} s"
    # a tiny block is 32 KiB: well under a millisecond to move, whatever the transport
    assert got.us_per_block < 1000.0
    assert n == 2 and seen == [block, block]


def test_live_fetches_move_the_seeded_averages(tiny):
    got, *_ = asyncio.run(_calibrated(tiny))
    model, cfg = tiny
    engine = Engine(model, cfg, block_size=BS, num_blocks=8)
    engine.costs.fetch_us_per_call = got.us_per_call
    engine.costs.fetch_us_per_block = got.us_per_block
    engine.costs.fetch(10, got.us_per_call * 10 / 1e6, got.us_per_block * 100 / 1e6)
    assert engine.costs.fetch_us_per_call > got.us_per_call
    assert engine.costs.fetch_us_per_block > got.us_per_block
