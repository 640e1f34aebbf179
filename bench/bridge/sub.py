"""The vLLM bridge's subscribers in one process: the ingest loop's CPU per block, ZMQ included.

``python -m bench.bridge.sub`` runs ``--engines`` real ``Subscriber``s (each its own
``EngineState``, no replay socket, index events dropped) on one event loop, as a bridge
process has them, each connected to a PUB socket of this process over TCP. Once every
subscriber is connected, the whole load (``bench.bridge.ingest.payloads``) is published at
once (no high-water marks: nothing is dropped) and the loop applies it. Time is the CPU time
of the loop's thread from the first publish until every batch was applied, less the publish
itself (timed apart), so ZMQ's I/O threads and this host's other load are not counted; the
ingest (``EngineState.ingest``) is timed apart too: ``sub_us_per_block`` is the rest (the
receive, the poller, asyncio, seq checks) per stored block.

``--against REV``: the same on the bridge and kvmesh code of ``REV``, alternated
(``bench.bridge.ingest.compare``). Output: one JSON line per run.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import typer
import zmq
import zmq.asyncio

from bench.bridge.ingest import bridge_state, compare, load_args, payloads
from bridge.engine_state import EngineState
from bridge.subscriber import Subscriber
from kvmesh.contract import DEFAULT_ALGO
from kvmesh.events import vllm as ve
from kvmesh.hashing import chain_hashes, none_hash


class _Timed(EngineState):
    """An ``EngineState`` that adds the thread CPU time of each batch's ingest to
    ``spent[0]`` (``ingest_parts`` where the code under test has it: its subscriber applies
    batches slice by slice; ``ingest`` in older code)."""

    spent = [0.0]

    if hasattr(EngineState, "ingest_parts"):
        def ingest_parts(self, seq: int, payload: bytes):  # type: ignore[override]
            parts = super().ingest_parts(seq, payload)
            while True:
                c = time.thread_time()
                try:
                    part = next(parts, None)
                finally:
                    self.spent[0] += time.thread_time() - c
                if part is None:
                    return
                yield part
    else:
        def ingest(self, seq: int, payload: bytes):  # type: ignore[override]
            c = time.thread_time()
            try:
                return super().ingest(seq, payload)
            finally:
                self.spent[0] += time.thread_time() - c


async def run(work: list[tuple[int, int, bytes]], engines: int, block_size: int) -> dict:
    ctx, pub_ctx = zmq.asyncio.Context(), zmq.Context()
    pubs, subs, tasks = [], [], []
    for _ in range(engines):
        pub = pub_ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, 0)
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        sub = Subscriber(bridge_state(block_size, _Timed), f"tcp://127.0.0.1:{port}", None,
                         lambda events: None, probe_interval=None, rcvhwm=0, ctx=ctx)
        pubs.append(pub)
        subs.append(sub)
        tasks.append(asyncio.create_task(sub.run()))
    while not all(s.stats.connects for s in subs):
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # the subscriptions reach the PUB sockets after the handshake
    _Timed.spent[0] = 0.0
    t0 = time.thread_time()
    for i, seq, payload in work:
        pubs[i].send_multipart(ve.pack_message(b"", seq, payload))
    sent = time.thread_time() - t0
    while sum(s.stats.applied for s in subs) < len(work):
        await asyncio.sleep(0)
    cpu = time.thread_time() - t0 - sent
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for p in pubs:
        p.close(linger=0)
    ctx.term()
    pub_ctx.term()
    stored = sum(s.state.stats.stored_blocks for s in subs)
    ingest = _Timed.spent[0]
    return {"stored_blocks": stored, "loop_cpu_s": round(cpu, 3),
            "blocks_per_cpu_s": round(stored / cpu),
            "loop_us_per_block": round(cpu / stored * 1e6, 3),
            "ingest_us_per_block": round(ingest / stored * 1e6, 3),
            "sub_us_per_block": round((cpu - ingest) / stored * 1e6, 3),
            "malformed": sum(s.stats.malformed for s in subs),
            "gaps": sum(s.stats.gaps for s in subs)}


def main(batches: int = 2_500, engines: int = 8, blocks: int = 128, requests: int = 4,
         bulk_removals: bool = False, block_size: int = 16,
         window: int = 64, repeat: int = 3,
         against: str = typer.Option("", help="git revision to compare with (before)"),
         rounds: int = typer.Option(3, help="with --against: before/after runs, alternated"),
         label: str = "") -> None:
    if against:
        args = [*load_args(batches, engines, blocks, requests, bulk_removals, block_size,
                           window), f"--repeat={repeat}"]
        for _ in compare(against, args, rounds, "bench.bridge.sub"):
            pass
        return
    work = payloads(batches, engines, blocks, block_size, window, requests, bulk_removals)
    chain_hashes(none_hash(), [1 << 17], 1, None, DEFAULT_ALGO)  # the token table, grown once
    runs = [asyncio.run(run(work, engines, block_size)) for _ in range(repeat)]
    out = min(runs, key=lambda r: r["loop_us_per_block"])
    out["label"] = label or "working tree"
    out["runs_loop_us_per_block"] = [r["loop_us_per_block"] for r in runs]
    out["code"] = os.path.dirname(os.path.dirname(sys.modules[Subscriber.__module__].__file__))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    typer.run(main)
