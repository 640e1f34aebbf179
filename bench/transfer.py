"""`kvmesh bench transfer`: the peer-KV data plane's transports side by side, and what a
fetched block costs against recomputing it.

Three measurements, in one run, the source in its own process (``bench.transfer_source``):

- throughput of each transport at each frame size (blocks of the 8-layer model), plus
  ``zmq+curve`` (the default encrypted, as it is on an address other hosts reach), rounds
  alternating so every transport sees the same machine load; wall GB/s (medians), and the
  CPU-bound rate ``bytes / max(source CPU, receiver CPU)`` (what each side's own core would
  give: on a shared machine the wall rate mostly measures the neighbours);
- the fetch cost per pull and per block: pulls of 1..N blocks end to end (claim, frames,
  the sink copying each block out; the connection to the source warm, as between peers),
  the fastest of ``repeats`` each, fitted as ``us_per_call + n * us_per_block``;
- the recompute cost per block: prefill time per token times the block size
  (``bench.recompute``), hence ``fetch_over_recompute`` and the crossover prefix length
  ``us_per_call / (recompute - fetch per block)`` blocks, below which recomputing wins.

See docs/benchmarks.md#peer-kv-transfer-kvmesh-bench-transfer.
"""
from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from typing import Any

import typer

FRAMES = (256 << 10, 1 << 20, 4 << 20)
FETCH_COUNTS = (1, 4, 16, 64)
GOAL_GBPS, GOAL_VS_GRPC, GOAL_FETCH_RATIO = 1.0, 4.0, 0.1
SEALED = "zmq+curve"  # the zmq plane encrypted (CURVE): what peers on a network use


def _rows() -> tuple[str, ...]:
    from kvmesh.transfer.transports import TRANSPORTS

    return (*TRANSPORTS, SEALED)


def _fit(points: dict[int, float]) -> tuple[float, float]:
    """Least-squares ``(per_call, per_block)`` of ``t = per_call + n * per_block``."""
    ns, ts = list(points), list(points.values())
    mn, mt = statistics.fmean(ns), statistics.fmean(ts)
    slope = (sum((n - mn) * (t - mt) for n, t in zip(ns, ts, strict=True))
             / sum((n - mn) ** 2 for n in ns))
    return mt - slope * mn, slope


class _Receiver:
    """Pulls into a preallocated buffer, as a worker copies blocks into its KV pool."""

    def __init__(self, source: Any, max_bytes: int) -> None:
        self.source = source
        self.dest = memoryview(bytearray(max_bytes))

    async def pull(self, transport: str, frame_bytes: int, count: int,
                   bb: int) -> tuple[float, float, float]:
        """``(wall s, source CPU s, receiver CPU s)`` of one pull."""
        from kvmesh.transfer.transports import pull

        ep = self.source.offer(transport, frame_bytes, count, bb)
        dest, span = self.dest, len(self.dest) - bb + 1

        def sink(i: int, block: memoryview) -> None:
            off = (i * bb) % span
            dest[off:off + bb] = block

        c0, r0 = self.source.cpu_s(), time.process_time()
        t0 = time.perf_counter()
        await pull(ep, bb, count, sink, timeout_s=120)
        wall = time.perf_counter() - t0
        r1 = time.process_time()
        return wall, self.source.cpu_s() - c0, r1 - r0


async def _throughput(rx: _Receiver, frames: tuple[int, ...], bb: int, mib: int,
                      rounds: int) -> tuple[dict, dict]:
    rows = _rows()
    count = max(1, (mib << 20) // bb)
    walls: dict[tuple[str, int], list[float]] = {}
    cpus: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for f in frames:
            for t in rows:
                wall, src, own = await rx.pull(t, f, count, bb)
                walls.setdefault((t, f), []).append(count * bb / wall / 1e9)
                cpus.setdefault((t, f), []).append(count * bb / max(src, own, 1e-9) / 1e9)
    wall_gbps = {t: {str(f): statistics.median(walls[t, f]) for f in frames} for t in rows}
    cpu_gbps = {t: {str(f): statistics.median(cpus[t, f]) for f in frames} for t in rows}
    return wall_gbps, cpu_gbps


async def _fetch_costs(rx: _Receiver, bb: int, repeats: int) -> dict[str, dict[str, float]]:
    from kvmesh.transfer.frames import DEFAULT_FRAME_BYTES

    rows = _rows()
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(repeats):
        for n in FETCH_COUNTS:
            for t in rows:
                wall, _, _ = await rx.pull(t, DEFAULT_FRAME_BYTES, n, bb)
                times.setdefault((t, n), []).append(wall)
    out = {}
    for t in rows:
        # the fastest of the repeats, as for the recompute side: on a shared host a median
        # carries the neighbours' bursts, which can even tilt the fit's slope negative
        call, block = _fit({n: min(times[t, n]) for n in FETCH_COUNTS})
        out[t] = {"us_per_call": call * 1e6, "us_per_block": block * 1e6}
    return out


def run(mib: int = 64, rounds: int = 5, repeats: int = 5, prompt_tokens: int = 512,
        block_size: int = 16, frames: tuple[int, ...] | None = None,
        models: tuple[str, ...] = ("tiny", "8-layer"), threads: int = 1) -> dict[str, Any]:
    """Every figure of the bench, as one dict (the ``--json`` output)."""
    from bench.recompute import MODELS, block_bytes, prefill_us_per_token
    from bench.transfer_source import Source
    from kvmesh.transfer.frames import DEFAULT_FRAME_BYTES
    from kvmesh.transfer.transports import DEFAULT_TRANSPORT

    frames = frames or FRAMES
    sizes = {m: block_bytes(MODELS[m], block_size) for m in models}
    big = sizes.get("8-layer", max(sizes.values()))
    max_bytes = max((mib << 20) + big, max(FETCH_COUNTS) * big)
    source = Source(sorted(set(frames) | {DEFAULT_FRAME_BYTES}), max_bytes)
    try:
        rx = _Receiver(source, max_bytes)
        wall, cpu = asyncio.run(_throughput(rx, frames, big, mib, rounds))
        fetch = {m: asyncio.run(_fetch_costs(rx, sizes[m], repeats)) for m in models}
    finally:
        source.close()
    out: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "default_transport": DEFAULT_TRANSPORT,
        "default_frame_bytes": DEFAULT_FRAME_BYTES, "throughput_block_bytes": big,
        "mib_per_pull": mib, "gbps": wall, "cpu_bound_gbps": cpu,
        "default_vs_grpc_by_frame": {f: wall[DEFAULT_TRANSPORT][f] / wall["grpc"][f]
                                     for f in wall["grpc"]},
        "default_vs_grpc_cpu_bound_by_frame": {f: cpu[DEFAULT_TRANSPORT][f] / cpu["grpc"][f]
                                               for f in cpu["grpc"]},
        # what encryption costs the default: its rate encrypted over plain (1.0: free)
        "curve_vs_plain_by_frame": {f: wall[SEALED][f] / wall[DEFAULT_TRANSPORT][f]
                                    for f in wall[SEALED]},
        "curve_vs_plain_cpu_bound_by_frame": {f: cpu[SEALED][f] / cpu[DEFAULT_TRANSPORT][f]
                                              for f in cpu[SEALED]},
        "models": {}, "fetch_over_recompute": {}, "curve_fetch_over_recompute": {},
        "crossover_tokens": {}, "prefill_threads": threads, "prompt_tokens": prompt_tokens,
    }
    key = str(DEFAULT_FRAME_BYTES) if str(DEFAULT_FRAME_BYTES) in wall["grpc"] else str(frames[0])
    out["default_vs_grpc"] = out["default_vs_grpc_by_frame"][key]
    out["default_vs_grpc_cpu_bound"] = out["default_vs_grpc_cpu_bound_by_frame"][key]
    out["curve_vs_plain"] = out["curve_vs_plain_by_frame"][key]
    out["curve_vs_plain_cpu_bound"] = out["curve_vs_plain_cpu_bound_by_frame"][key]
    for m in models:
        per_token = prefill_us_per_token(MODELS[m], prompt_tokens, block_size, threads=threads)
        recompute = per_token * block_size
        mine = fetch[m][DEFAULT_TRANSPORT]
        saving = recompute - mine["us_per_block"]
        blocks = max(0.0, mine["us_per_call"]) / saving if saving > 0 else math.inf
        out["models"][m] = {"layers": MODELS[m]["num_hidden_layers"], "block_size": block_size,
                            "block_bytes": sizes[m], "prefill_us_per_token": per_token,
                            "recompute_us_per_block": recompute, "fetch": fetch[m]}
        out["fetch_over_recompute"][m] = mine["us_per_block"] / recompute
        out["curve_fetch_over_recompute"][m] = fetch[m][SEALED]["us_per_block"] / recompute
        out["crossover_tokens"][m] = (None if math.isinf(blocks)
                                      else math.ceil(blocks) * block_size)
    ref = "8-layer" if "8-layer" in models else models[-1]
    out["us_per_block"] = fetch[ref][DEFAULT_TRANSPORT]["us_per_block"]
    out["us_per_call"] = fetch[ref][DEFAULT_TRANSPORT]["us_per_call"]
    out["goals"] = {"default_ge_1_gbps": wall[DEFAULT_TRANSPORT][key] >= GOAL_GBPS,
                    "default_ge_1_gbps_cpu_bound": cpu[DEFAULT_TRANSPORT][key] >= GOAL_GBPS,
                    "default_ge_4x_grpc": out["default_vs_grpc"] >= GOAL_VS_GRPC,
                    "default_ge_4x_grpc_cpu_bound":
                        out["default_vs_grpc_cpu_bound"] >= GOAL_VS_GRPC,
                    "fetch_le_0.1x_recompute": out["fetch_over_recompute"][ref] <= GOAL_FETCH_RATIO}
    return out


def _print(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    frames = list(res["gbps"]["grpc"])
    table = Table(title=f"peer KV transfer over loopback: GB/s, blocks of "
                        f"{res['throughput_block_bytes'] >> 10} KiB, {res['mib_per_pull']} MiB "
                        "a pull (wall | CPU-bound)")
    table.add_column("transport")
    for f in frames:
        table.add_column(f"{int(f) >> 10} KiB frames", justify="right")
    for t, row in res["gbps"].items():
        star = " (default)" if t == res["default_transport"] else ""
        table.add_row(t + star, *(f"{row[f]:.2f} | {res['cpu_bound_gbps'][t][f]:.2f}"
                                  for f in frames))
    console.print(table)
    console.print(f"default / grpc at {res['default_frame_bytes'] >> 10} KiB frames: "
                  f"{res['default_vs_grpc']:.2f}x wall, {res['default_vs_grpc_cpu_bound']:.2f}x "
                  "CPU-bound")
    console.print(f"{SEALED} / default (the cost of encryption): {res['curve_vs_plain']:.2f}x "
                  f"wall, {res['curve_vs_plain_cpu_bound']:.2f}x CPU-bound")
    costs = Table(title="fetch vs recompute, per block (µs)")
    for col in ("model", "block", "recompute", "fetch (default)", "per call", "fetch/recompute",
                "crossover", f"fetch ({SEALED})"):
        costs.add_column(col, justify="right")
    for m, r in res["models"].items():
        f = r["fetch"][res["default_transport"]]
        cross = res["crossover_tokens"][m]
        costs.add_row(m, f"{r['block_bytes'] >> 10} KiB", f"{r['recompute_us_per_block']:.0f}",
                      f"{f['us_per_block']:.1f}", f"{f['us_per_call']:.0f}",
                      f"{res['fetch_over_recompute'][m]:.4f}",
                      "never" if cross is None else f"{cross} tokens",
                      f"{r['fetch'][SEALED]['us_per_block']:.1f}")
    console.print(costs)
    console.print("goals: " + ", ".join(f"{k} {'met' if v else 'NOT met'}"
                                        for k, v in res["goals"].items()))


def register(bench: typer.Typer) -> None:
    @bench.command("transfer")
    def transfer(mib: int = typer.Option(64, help="MiB moved per throughput pull"),
                 rounds: int = typer.Option(5, help="alternating rounds of the throughput runs"),
                 repeats: int = typer.Option(5, help="rounds of the fetch-cost pulls"),
                 prompt_tokens: int = typer.Option(512, help="prefill length of the recompute "
                                                   "cost"),
                 block_size: int = typer.Option(16, help="tokens per KV block"),
                 threads: int = typer.Option(1, help="torch threads of the recompute prefill"),
                 as_json: bool = typer.Option(False, "--json")) -> None:
        """Peer-KV data plane: zmq vs grpc vs shm throughput, fetch vs recompute per block."""
        res = run(mib, rounds, repeats, prompt_tokens, block_size, threads=threads)
        if as_json:
            print(json.dumps(res))
        else:
            _print(res)
