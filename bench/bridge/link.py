"""The vLLM bridge's path from engine state to index, in one process: CPU per block.

A real service and ``EngineLink``s on one loop, fed batches without ZMQ, never shedding:
``link_us_per_block`` is this process's CPU per stored block outside ``EngineState.ingest``.
``--against REV`` alternates with REV's code.

See docs/architecture.md#index-route-and-bridge-benches.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable

import typer

from bench.bridge.ingest import bridge_state, compare, load_args, payloads
from bridge.link import EngineLink
from deploy.process import ServerProcess
from deploy.waiting import wait_until
from kvmesh.contract import DEFAULT_ALGO
from kvmesh.hashing import chain_hashes, none_hash
from kvmesh.link import BeatThread


async def feed(address: str, work: list[tuple[int, int, bytes]], engines: int,
               block_size: int, turn: int, backlog: int) -> dict:
    """One run: fresh links (registered and synced before timing), ``work`` fed through
    them until the index acknowledged every event; CPU split into ingest and the rest."""
    states = [bridge_state(block_size) for _ in range(engines)]
    root = none_hash()
    links = [EngineLink([address], s, None, worker_id=f"link-e{i}", address="127.0.0.1:9",
                        model="bench", root_hash=root) for i, s in enumerate(states)]
    beats = BeatThread().start()
    for link in links:
        link.beats = beats
    tasks = [asyncio.create_task(link.run()) for link in links]
    await _until(lambda: all(ln.registered and not ln.need_sync for ln in links))
    per_engine: list[list[tuple[int, bytes]]] = [[] for _ in range(engines)]
    for i, seq, payload in work:
        per_engine[i].append((seq, payload))
    ingest = 0.0
    t0, w0 = time.process_time(), time.perf_counter()
    pos = 0
    while pos < len(per_engine[0]):
        for i, link in enumerate(links):
            # one clock read per turn: CPU clocks are system calls, not free per batch
            state, c = states[i], time.process_time()
            outs = [state.ingest(seq, payload) for seq, payload in per_engine[i][pos:pos + turn]]
            ingest += time.process_time() - c
            for out in outs:
                link.on_events(out)
        pos += turn
        await asyncio.sleep(0)
        while any(ln.pending.blocks > backlog for ln in links):
            await asyncio.sleep(0.0005)
    await _until(lambda: not any(ln.pending for ln in links))
    cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    counters = sum((ln.counters for ln in links), start=type(links[0].counters)())
    for link in links:
        await link.close()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.to_thread(beats.stop)
    stored = sum(s.stats.stored_blocks for s in states)
    return {"stored_blocks": stored, "cpu_s": round(cpu, 3), "ingest_cpu_s": round(ingest, 3),
            "wall_s": round(wall, 3), "blocks_per_cpu_s": round(stored / cpu),
            "link_us_per_block": round((cpu - ingest) / stored * 1e6, 3),
            "ingest_us_per_block": round(ingest / stored * 1e6, 3),
            "events_published": counters["events_published"],
            "publishes": counters["publishes"],
            "sheds": counters["sheds"], "resyncs": counters["resyncs"],
            "registrations": counters["registrations"]}


async def _until(fn: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not fn():
        if time.monotonic() > deadline:
            raise TimeoutError("the links did not get there")
        await asyncio.sleep(0.002)


def main(batches: int = 5_000, engines: int = 8, blocks: int = 128, requests: int = 4,
         bulk_removals: bool = False, block_size: int = 16,
         window: int = 64, turn: int = 32, backlog: int = 16_384, repeat: int = 2,
         against: str = typer.Option("", help="git revision to compare with (before)"),
         rounds: int = typer.Option(3, help="with --against: before/after runs, alternated"),
         label: str = "") -> None:
    if against:
        args = [*load_args(batches, engines, blocks, requests, bulk_removals, block_size,
                           window), f"--turn={turn}", f"--backlog={backlog}",
                f"--repeat={repeat}"]
        for _ in compare(against, args, rounds, "bench.bridge.link"):
            pass
        return
    work = payloads(batches, engines, blocks, block_size, window, requests, bulk_removals)
    chain_hashes(none_hash(), [1], 1, None, DEFAULT_ALGO)
    service = ServerProcess("bench-service", "service", [
        "--port", "0", "--log-level", "warning", "--backend", "memory",
        # the links report no pool size (no engine metrics here): the cap must not bite
        "--min-indexed-cap", "1000000"]).start()
    try:
        wait_until(lambda: service.address is not None, 10, what="the service")
        runs = [asyncio.run(feed(service.address, work, engines, block_size, turn, backlog))
                for _ in range(repeat)]
    finally:
        service.stop()
    out = min(runs, key=lambda r: r["link_us_per_block"])
    out["label"] = label or "working tree"
    out["runs_link_us_per_block"] = [r["link_us_per_block"] for r in runs]
    out["code"] = os.path.dirname(os.path.dirname(sys.modules[EngineLink.__module__].__file__))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    typer.run(main)
