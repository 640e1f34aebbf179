"""`kvmesh bench replay TRACE.jsonl`: a Mooncake-format trace through the real hashing, KV
cache managers, index backends and routing policies, against peers' routers, in simulated
time.

Parts: :mod:`.trace` (loading, token synthesis, memoized hash chains), :mod:`.cluster`
(simulated workers and the prefill/decode cost model), :mod:`.peers` (SGLang-style
approximate tree, Ray Serve's PrefixTree), :mod:`.replay` (the loop), :mod:`.report` (JSON,
table, targets, plot), :mod:`.rows` (what a row runs: a policy, a variant
``kvmesh[weight=value,...]``, or ``kvmesh@REV`` for ``--against REV``). ``client/cli.py``
calls :func:`register`.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import typer

from kvmesh.contract import POLICIES as INDEX_POLICIES
from service.config import BACKENDS

__all__ = ["INDEX_POLICIES", "PEERS", "POLICIES", "register"]

# Besides kvmesh's own policies: other projects' routers, and the pooled-cache upper bound.
PEERS = ("approx_tree", "ray_prefix_tree", "oracle")
POLICIES = (*INDEX_POLICIES, *PEERS)


def _policies(policy: str | None, all_policies: bool, against: list[str],
              peer_fetch: bool = False) -> list[str]:
    """The rows' labels: the policies (or variants) asked for, then ``kvmesh+fetch`` (with
    ``peer_fetch``) and each ``kvmesh@REV`` right after the plain ``kvmesh`` row (at the end
    without one). REV's code is loaded here, so a revision that cannot run is refused before
    any replay."""
    from bench.variants import split_list

    from .rows import FETCH, parse_row

    if all_policies:
        labels = list(POLICIES)
    else:
        try:
            labels = [parse_row(item).label for item in split_list(policy or "kvmesh")]
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--policy") from e
    at = labels.index("kvmesh") + 1 if "kvmesh" in labels else len(labels)
    revs = [f"kvmesh@{rev.strip()}" for rev in against]
    if peer_fetch and "kvmesh" + FETCH not in labels:
        revs.insert(0, "kvmesh" + FETCH)
    for label in revs:
        try:
            parse_row(label).index_policy()
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--against") from e
    return labels[:at] + revs + labels[at:]


def register(bench: typer.Typer) -> None:
    """Add the ``replay`` command to the ``kvmesh bench`` group."""

    @bench.command("replay")
    def replay(
        trace: Path = typer.Argument(..., exists=True, dir_okay=False,
                                     help="Mooncake-format JSONL trace"),
        workers: int = typer.Option(8, min=1, help="simulated workers"),
        block_size: int = typer.Option(16, min=1, help="tokens per KV block"),
        capacity_blocks: int = typer.Option(
            25_000, min=1, help="KV blocks per worker (default: 400k tokens, the KV space of "
            "an 80 GB GPU serving an 8B model; far below either trace's working set)"),
        policy: str = typer.Option(None, help="policy, or several comma-separated: "
                                   f"{', '.join(POLICIES)} (default: kvmesh); a variant "
                                   "kvmesh[weight=value,...] changes CostWeights fields"),
        against: list[str] = typer.Option([], "--against", metavar="REV",
                                          help="also run the kvmesh policy of git revision "
                                          "REV (row kvmesh@REV) in this simulator; repeatable"),
        all_policies: bool = typer.Option(False, "--all-policies",
                                          help="run every policy and write a comparison PNG"),
        index: str = typer.Option("memory", help=f"index backend: {' or '.join(BACKENDS)}"),
        redis_url: str = typer.Option(None, help="Redis/Valkey for --index redis "
                                      "(default: start a private Valkey)"),
        limit: int = typer.Option(None, min=1, help="replay only the first N requests"),
        as_json: bool = typer.Option(False, "--json", help="one JSON line per policy"),
        plot: Path = typer.Option(None, help="write the comparison PNG here "
                                  "(default with --all-policies: replay-<trace>.png)"),
        prefill_s_per_token: float = typer.Option(
            None, help="prefill seconds per uncached prompt token (default: 5e-5, Llama-3-8B "
            "on an H100; see CostModel)"),
        decode_step_s: float = typer.Option(None, help="fixed seconds per decode step "
                                            "(default: 5e-3)"),
        decode_s_per_ctx_token: float = typer.Option(
            None, help="decode seconds per step per context token in the batch "
            "(default: 4e-8)"),
        max_running: int = typer.Option(None, min=1, help="running requests per worker "
                                        "(default: 256)"),
        seed: int = typer.Option(0, help="seed of the policies' tie-breaking"),
        peer_fetch: bool = typer.Option(
            False, "--peer-fetch", help="also run row kvmesh+fetch: the kvmesh policy "
            "planning peer fetches, its workers pulling a prefix from its holder"),
        min_fetch_blocks: int = typer.Option(4, min=1, help="fewest blocks worth a fetch "
                                             "(rows kvmesh+fetch)"),
        fetch_us_per_block: float = typer.Option(
            None, min=0, help="seconds of one fetched block, in us (default: the block's "
            "bytes at 25 GB/s, an RDMA NIC per GPU; 84 us for 2 MiB)"),
        fetch_us_per_call: float = typer.Option(None, min=0, help="fixed us of one fetch "
                                                "(default: 1200)"),
    ) -> None:
        """Replay a trace through the real KV managers, index and policies vs peers'
        routers; token hit rate, load imbalance and estimated TTFT per policy."""
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        from . import report
        from .cluster import CostModel
        from .replay import ReplayConfig, run
        from .trace import load_trace

        if index not in ("memory", "redis"):
            raise typer.BadParameter("valid: memory, redis", param_hint="--index")
        names = _policies(policy, all_policies, against, peer_fetch)
        try:
            reqs = load_trace(trace, limit)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="TRACE") from e
        given = {"prefill_s_per_token": prefill_s_per_token, "decode_step_s": decode_step_s,
                 "decode_s_per_ctx_token": decode_s_per_ctx_token, "max_running": max_running}
        cost = CostModel(**{k: v for k, v in given.items() if v is not None})
        cfg = ReplayConfig(workers=workers, block_size=block_size,
                           capacity_blocks=capacity_blocks, seed=seed, cost=cost,
                           min_fetch_blocks=min_fetch_blocks,
                           fetch_us_per_block=fetch_us_per_block,
                           fetch_us_per_call=fetch_us_per_call)
        err = Console(stderr=True)
        with Progress(TextColumn("{task.description:<16}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), TimeRemainingColumn(), console=err) as bar:

            def progress(name: str, total: int) -> Callable[[], None]:
                task = bar.add_task(name, total=total)
                return lambda: bar.advance(task)

            results = run(reqs, names, cfg, index=index, redis_url=redis_url,
                          progress=progress)
        title = (f"{trace.name}: {len(reqs):,} requests, {workers} workers x "
                 f"{capacity_blocks:,} blocks of {block_size}, index {index}; prefill "
                 f"{cost.prefill_s_per_token:g} s/token, decode {cost.decode_step_s:g} s/step "
                 f"+ {cost.decode_s_per_ctx_token:g} s/context token")
        if any("+fetch" in n for n in names):
            f = cfg.fetch_cost()
            title += (f"; fetch {f.call_s * 1e6:g} us/call + {f.block_s * 1e6:g} us/block, "
                      f">= {min_fetch_blocks} blocks")
        if as_json:
            for line in report.json_lines(results):
                print(line)
        else:
            out = Console()
            report.print_table(results, title, out if out.is_terminal else Console(width=180))
        if plot is None and all_policies:
            plot = Path(f"replay-{trace.stem}.png")
        if plot is not None:
            out = report.plot(results, plot, title)
            err.print(f"plot: {out}")
