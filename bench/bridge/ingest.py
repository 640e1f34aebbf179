"""The vLLM bridge's ingest path in one process: blocks per CPU-second, no sockets.

Times ``EngineState.ingest`` and the ``PublishEventsRequest`` built from its events, in
process CPU time (the bridge's capacity per CPU-second), on ``bench.bridge.load``'s payloads
built beforehand. ``--against REV`` runs the same on REV's code. One JSON line per run.

See docs/architecture.md#index-route-and-bridge-benches.
"""
from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator

import typer

from bench.bridge.load import VOCAB, Steps
from bridge.engine_state import EngineState
from kvmesh.contract import DEFAULT_ALGO
from kvmesh.events import vllm as ve
from kvmesh.hashing import chain_hashes, none_hash
from kvmesh.link import publish_head, publish_request


def payloads(batches: int, engines: int, blocks: int, block_size: int, window: int,
             requests: int = 4, bulk_removals: bool = False, seed: int = 0
             ) -> list[tuple[int, int, bytes]]:
    """``(engine, seq, payload)`` in publish order, as ``bench.bridge.load`` publishes."""
    steps = Steps(engines, blocks, requests, block_size, window,
                  bulk_removals=bulk_removals, seed=seed)
    out = []
    for n in range(batches):
        i = n % engines
        payload = ve.encode_batch(ve.KVEventBatch(ts=time.time(), events=steps.batch(i),
                                                  data_parallel_rank=0))
        out.append((i, n // engines, payload))
    return out


def bridge_state(block_size: int, cls: type[EngineState] = EngineState) -> EngineState:
    """An engine state as the bridge process builds it (its events in wire form where the
    code under test has that: ``--against`` may run older code)."""
    if "wire" in inspect.signature(EngineState).parameters:
        return cls(block_size=block_size, wire=True)
    return cls(block_size=block_size)


def measure(work: list[tuple[int, int, bytes]], engines: int, block_size: int,
            per_request: int) -> dict:
    """CPU seconds to ingest ``work`` and serialize its requests; blocks stored per second."""
    states = [bridge_state(block_size) for _ in range(engines)]
    heads = [publish_head(f"e{j}", 1) for j in range(engines)]
    queued: list[list] = [[] for _ in range(engines)]
    size = 0
    t0 = time.process_time()
    for n, (i, seq, payload) in enumerate(work):
        queued[i].extend(states[i].ingest(seq, payload))
        if (n + 1) % (per_request * engines) == 0 or n + 1 == len(work):
            for j, events in enumerate(queued):
                if events:
                    size += len(publish_request(heads[j], events))  # as the link does
                    queued[j] = []
    cpu = time.process_time() - t0
    stored = sum(s.stats.stored_blocks for s in states)
    removed = sum(s.stats.removed_blocks for s in states)
    return {"stored_blocks": stored, "removed_blocks": removed, "cpu_s": round(cpu, 3),
            "blocks_per_cpu_s": round(stored / cpu), "request_bytes": size,
            "rehashed": sum(s.stats.rehashed for s in states)}


def _extract(rev: str, into: str) -> None:
    """The ``bridge`` and ``kvmesh`` packages of ``rev`` under ``into``."""
    archive = subprocess.run(["git", "archive", rev, "bridge", "kvmesh"], check=True,
                             capture_output=True).stdout
    path = os.path.join(into, "src.tar")
    with open(path, "wb") as f:
        f.write(archive)
    with tarfile.open(path) as tar:
        tar.extractall(into, filter="data")


def _child(pythonpath: list[str], args: list[str], label: str, cwd: str,
           module: str = "bench.bridge.ingest") -> dict:
    """One measurement (``python -m module``) in a fresh process with ``pythonpath`` first on
    the path, run from ``cwd`` (``-m`` puts the working directory before ``PYTHONPATH``)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath))
    out = subprocess.run([sys.executable, "-m", module, *args,
                          f"--label={label}"], check=True, env=env, capture_output=True,
                         text=True, cwd=cwd).stdout
    return json.loads(out.splitlines()[-1])


def compare(against: str, args: list[str], rounds: int,
            module: str = "bench.bridge.ingest") -> Iterator[tuple[str, dict]]:
    """``python -m module args`` on the tree of git revision ``against`` and on this one,
    alternated ``rounds`` times (this host's other load drifts); each result, printed as it
    comes, with its side's name."""
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        old = os.path.join(tmp, "src")
        os.mkdir(old)
        _extract(against, old)
        # the old packages first on the path, the bench module from here
        for _ in range(rounds):
            for name, path in ((f"before ({against})", [old, here]),
                               ("after (working tree)", [here])):
                r = _child(path, args, name, tmp, module)
                print(json.dumps(r), flush=True)
                yield name, r


def load_args(batches: int, engines: int, blocks: int, requests: int, bulk_removals: bool,
              block_size: int, window: int) -> list[str]:
    """The load's flags (``payloads``' arguments) as a bench module takes them, for
    ``compare``."""
    return [f"--batches={batches}", f"--engines={engines}", f"--blocks={blocks}",
            f"--requests={requests}", "--bulk-removals" if bulk_removals else "--no-bulk-removals",
            f"--block-size={block_size}", f"--window={window}"]


def main(batches: int = 2_500, engines: int = 8, blocks: int = 128, requests: int = 4,
         bulk_removals: bool = False, block_size: int = 16, window: int = 64,
         per_request: int = 2, repeat: int = 3,
         against: str = typer.Option("", help="git revision to compare with (before)"),
         rounds: int = typer.Option(3, help="with --against: before/after runs, alternated"),
         label: str = "") -> None:
    if against:
        args = [*load_args(batches, engines, blocks, requests, bulk_removals, block_size,
                           window), f"--per-request={per_request}", f"--repeat={repeat}"]
        best: dict[str, dict] = {}
        for name, r in compare(against, args, rounds):
            if r["blocks_per_cpu_s"] > best.get(name, {}).get("blocks_per_cpu_s", 0):
                best[name] = r
        before, after = best.values()
        print(json.dumps({"before_blocks_per_cpu_s": before["blocks_per_cpu_s"],
                          "after_blocks_per_cpu_s": after["blocks_per_cpu_s"],
                          "speedup": round(after["blocks_per_cpu_s"]
                                           / before["blocks_per_cpu_s"], 2)}), flush=True)
        return
    work = payloads(batches, engines, blocks, block_size, window, requests, bulk_removals)
    # the token encoder's table grows once per process: not a per-block cost
    chain_hashes(none_hash(), [VOCAB - 1], 1, None, DEFAULT_ALGO)
    runs = [measure(work, engines, block_size, per_request) for _ in range(repeat)]
    out = max(runs, key=lambda r: r["blocks_per_cpu_s"])
    out["label"] = label or "working tree"
    out["code"] = os.path.dirname(os.path.dirname(sys.modules[EngineState.__module__].__file__))
    out["runs_blocks_per_cpu_s"] = [r["blocks_per_cpu_s"] for r in runs]
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    typer.run(main)
