"""`kvmesh bench tiers TRACE`: the tiered KV cache on a Mooncake trace, tier setups side by side.

Every setup replays the same trace slice through the replay machinery (real hashing,
managers, index and policy, simulated time) with the same device pool, differing only in the
tiers beyond it (and layered eviction, pins, synchronous offloads); ``bound`` is a device pool
as large as device + CPU. Per setup: hit rate by tier, prefill tokens, TTFT, copy bytes.

See docs/architecture.md#replay-and-simulation.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import typer

from bench.replay.cluster import CostModel
from bench.replay.replay import PolicyResult, ReplayConfig
from bench.replay.trace import TraceRequest
from kvmesh.contract import LOWER_TIERS
from service.config import CostWeights

TIERS = ("gpu", "gpu+cpu", "gpu+cpu+disk")
OPTIONS = ("layered", "pin", "sync")
DEFAULT_SETUPS = ("gpu", "gpu+cpu", "gpu+cpu+disk", "gpu/layered", "gpu+cpu/layered",
                  "gpu/pin", "gpu+cpu/pin", "gpu+cpu/sync", "bound")
BASELINE, GOAL_SETUP, BOUND = "gpu", "gpu+cpu", "bound"


@dataclass(frozen=True)
class Setup:
    """One column of the comparison: which tiers, eviction order and pinning."""

    name: str
    cpu: bool = False
    disk: bool = False
    layered: bool = False
    pin: bool = False
    sync: bool = False  # offloads complete before the step (the data plane before
    # write-behind: CostModel.offloads)
    bound: bool = False  # device pool of (1 + cpu_x) x capacity, no lower tier

    @classmethod
    def parse(cls, name: str) -> Setup:
        """``TIER[/option...]`` with TIER one of :data:`TIERS` and options from
        :data:`OPTIONS`; raises ValueError."""
        if name.strip() == BOUND:
            return cls(BOUND, bound=True)
        tiers, *opts = name.strip().split("/")
        bad = [o for o in opts if o not in OPTIONS]
        if tiers not in TIERS or bad or len(set(opts)) != len(opts):
            raise ValueError(f"bad setup {name!r}: {BOUND}, or TIER[/layered][/pin][/sync] "
                             f"with TIER one of {', '.join(TIERS)}")
        return cls(name.strip(), cpu="cpu" in tiers, disk="disk" in tiers,
                   layered="layered" in opts, pin="pin" in opts, sync="sync" in opts)

    def config(self, base: ReplayConfig, cpu_x: float, disk_x: float) -> ReplayConfig:
        cap = base.capacity_blocks
        if self.bound:
            return replace(base, capacity_blocks=round(cap * (1 + cpu_x)))
        return replace(base, cpu_blocks=round(cap * cpu_x) if self.cpu else 0,
                       disk_blocks=round(cap * disk_x) if self.disk else 0,
                       eviction="layered" if self.layered else "lru", auto_pin=self.pin,
                       cost=replace(base.cost,
                                    offloads="sync" if self.sync else "write-behind"))


def credits(cost: CostModel, block_size: int) -> CostWeights:
    """The routing weights, crediting CPU and disk matches by what onboarding saves."""
    recompute = cost.prefill_s(block_size)

    def saved(tier: str) -> float:
        return min(max(1.0 - cost.onboard_s(tier, block_size) / recompute, 0.0), 1.0)

    return CostWeights(cpu_credit=saved("cpu"), disk_credit=saved("disk"))


@dataclass
class SetupResult:
    """One setup's replay, its bytes moved and its ratios against another setup."""

    setup: Setup
    cfg: ReplayConfig
    result: PolicyResult

    def bytes_of(self, blocks: int) -> int:
        return blocks * self.cfg.cost.block_bytes(self.cfg.block_size)

    def hit_share(self, tier: str) -> float:
        """Share of the hit tokens that came from ``tier`` (they sum to 1 over tiers)."""
        r = self.result
        return r.hit_by_tier.get(tier, 0) / r.hit_tokens if r.hit_tokens else 0.0

    def onboard_bytes(self, tier: str | None = None) -> int:
        """Bytes onboarded from ``tier`` (all lower tiers when None)."""
        blocks = self.result.copies.onboard_blocks
        return self.bytes_of(sum(blocks.values()) if tier is None else blocks.get(tier, 0))

    def hit_x(self, base: SetupResult) -> float:
        b = base.result.token_hit_rate
        return self.result.token_hit_rate / b if b else math.inf

    def ttft_cut(self, base: SetupResult, q: float | None = None) -> float:
        """How much lower this TTFT (mean, or percentile ``q``) is than ``base``'s: 0.3 is
        30% lower, negative is higher."""
        b = base.result.ttft_s(q)
        return 1 - self.result.ttft_s(q) / b if b else 0.0

    def summary(self, base: SetupResult | None = None) -> dict[str, object]:
        r, c = self.result, self.result.copies
        out: dict[str, object] = {
            "setup": self.setup.name, "cpu_blocks": self.cfg.cpu_blocks,
            "disk_blocks": self.cfg.disk_blocks, "requests": r.requests,
            "token_hit_rate": round(r.token_hit_rate, 4),
            "hit_share_by_tier": {t: round(self.hit_share(t), 4) for t in sorted(r.hit_by_tier)},
            "prefill_tokens": r.prefill_tokens,
            "mean_ttft_s": round(r.ttft_s(), 4), "p90_ttft_s": round(r.ttft_s(90), 4),
            "onboard_bytes": {t: self.onboard_bytes(t) for t in sorted(c.onboard_blocks)},
            "offload_bytes": self.bytes_of(c.offload_blocks),
            "spill_bytes": self.bytes_of(c.spill_blocks),
            "onboard_wait_s": round(c.onboard_wait_s, 3), "evictions": r.evictions,
            "wall_s": round(r.wall_s, 1),
        }
        if base is not None:
            out.update(hit_rate_x=round(self.hit_x(base), 3),
                       mean_ttft_cut=round(self.ttft_cut(base), 3),
                       p90_ttft_cut=round(self.ttft_cut(base, 90), 3))
        return out


def run(reqs: Sequence[TraceRequest], setups: Sequence[Setup], base: ReplayConfig, *,
        cpu_x: float = 4.0, disk_x: float = 16.0, policy: str = "kvmesh",
        progress: Callable[[str, int], Callable[[], None]] | None = None
        ) -> list[SetupResult]:
    """Replay ``reqs`` under each setup in turn (one policy, in-memory index)."""
    import asyncio

    from bench.replay.replay import replay_policy
    from bench.replay.trace import TokenSynth
    from service.index import open_backend

    async def all_setups() -> list[SetupResult]:
        synth = TokenSynth(base.block_size, algo=base.hash_algo)
        out = []
        for s in setups:
            cfg = s.config(base, cpu_x, disk_x)
            backend = open_backend("memory", None, timeout_s=10.0)
            tick = progress(s.name, len(reqs)) if progress is not None else (lambda: None)
            try:
                res = await replay_policy(policy, reqs, synth, cfg, lambda b=backend: b, tick)
            finally:
                await backend.close()
            out.append(SetupResult(s, cfg, res))
        return out

    return asyncio.run(all_setups())


def goals(results: Sequence[SetupResult], cost: CostModel,
          block_size: int) -> list[tuple[str, bool, str]]:
    """(goal, met, figures) for the tiered cache's goals whose setups ran."""
    by = {r.setup.name: r for r in results}
    out: list[tuple[str, bool, str]] = []
    recompute = cost.prefill_s(block_size)
    for tier in LOWER_TIERS:
        ratio = cost.onboard_s(tier, block_size) / recompute
        out.append((f"onboard a {tier} block < 1/5 of recomputing it", ratio < 0.2,
                    f"{cost.onboard_s(tier, block_size) * 1e6:.0f} us / "
                    f"{recompute * 1e6:.0f} us = {ratio:.2f}"))
    b, g = by.get(BASELINE), by.get(GOAL_SETUP)
    if b is not None and g is not None:
        out.append(("gpu+cpu hit rate >= 1.5x gpu", g.hit_x(b) >= 1.5,
                    f"{g.result.token_hit_rate:.2%} / {b.result.token_hit_rate:.2%} = "
                    f"{g.hit_x(b):.2f}x"))
        detail = (f"{g.result.ttft_s():.3f} s vs {b.result.ttft_s():.3f} s: "
                  f"{g.ttft_cut(b):.0%} lower")
        bound = by.get(BOUND)
        if bound is not None:
            detail += (f" (the bound, the CPU tier's memory at device speed: "
                       f"{bound.ttft_cut(b):.0%} lower)")
        out.append(("gpu+cpu mean TTFT >= 30% lower than gpu", g.ttft_cut(b) >= 0.3, detail))
        if bound is not None and bound.ttft_cut(b) > 0:
            share = g.ttft_cut(b) / bound.ttft_cut(b)
            out.append(("gpu+cpu mean TTFT cut >= 90% of the bound's", share >= 0.9,
                        f"{g.ttft_cut(b):.1%} / {bound.ttft_cut(b):.1%} = {share:.0%}"))
    return out


def register(bench: typer.Typer) -> None:
    """Add the ``tiers`` command to the ``kvmesh bench`` group."""

    @bench.command("tiers")
    def tiers(
        trace: Path = typer.Argument(None, exists=True, dir_okay=False,
                                     help="Mooncake-format JSONL trace (not with "
                                     "--step-overhead)"),
        limit: int = typer.Option(None, min=1, help="replay only the first N requests"),
        workers: int = typer.Option(8, min=1, help="simulated workers"),
        block_size: int = typer.Option(16, min=1, help="tokens per KV block"),
        capacity_blocks: int = typer.Option(
            5_000, min=1, help="device KV blocks per worker (default: 80k tokens, 10 GB of "
            "Llama-3-8B KV, far below the working set)"),
        cpu_x: float = typer.Option(4.0, min=0.0, help="CPU tier size, times the device pool"),
        disk_x: float = typer.Option(16.0, min=0.0, help="disk tier size, times the device "
                                     "pool"),
        setups: str = typer.Option(
            ",".join(DEFAULT_SETUPS), help="comma-separated TIER[/layered][/pin][/sync], "
            f"TIER one of {', '.join(TIERS)}, or {BOUND} (device pool of (1 + cpu-x) x "
            "capacity)"),
        policy: str = typer.Option("kvmesh", help="routing policy"),
        as_json: bool = typer.Option(False, "--json", help="one JSON line per setup"),
        plot: Path = typer.Option(None, help="write the comparison PNG here"),
        step_overhead: bool = typer.Option(
            False, "--step-overhead", help="instead of a trace: real engines' step time "
            "with synchronous and write-behind offloads vs none (bench/tiers/steps.py)"),
        steps: int = typer.Option(60, min=1, help="--step-overhead: measured steps each"),
        batch: int = typer.Option(8, min=1, help="--step-overhead: prompts per step"),
        prompt_tokens: int = typer.Option(128, min=1, help="--step-overhead: tokens each"),
        kv_scale: int = typer.Option(1, min=1, help="--step-overhead: the tiny model with "
                                     "this many times its KV and attention heads"),
        link_us_per_block: float = typer.Option(
            0.0, min=0.0, help="--step-overhead: emulate a slower link, each offloaded "
            "block's copy taking this many us more (e.g. a GPU's share of a step)"),
    ) -> None:
        """The tiered KV cache on a trace: hit rate, TTFT, prefill and bytes moved for
        gpu only / gpu+cpu / gpu+cpu+disk, layered eviction and pinning, side by side.
        With --step-overhead: what offloads cost real engines' steps."""
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        if step_overhead:
            _step_overhead(steps, batch, prompt_tokens, block_size, cpu_x, kv_scale,
                           link_us_per_block, as_json)
            return
        if trace is None:
            raise typer.BadParameter("give a trace (or --step-overhead)", param_hint="TRACE")

        from bench.replay import INDEX_POLICIES
        from bench.replay.trace import load_trace
        from bench.tiers import report as tiers_report

        if policy not in INDEX_POLICIES:
            raise typer.BadParameter(f"valid: {', '.join(INDEX_POLICIES)}",
                                     param_hint="--policy")
        try:
            chosen = [Setup.parse(n) for n in setups.split(",") if n.strip()]
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--setups") from e
        try:
            reqs = load_trace(trace, limit)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="TRACE") from e
        cost = CostModel()
        base = ReplayConfig(workers=workers, block_size=block_size,
                            capacity_blocks=capacity_blocks, cost=cost,
                            weights=credits(cost, block_size))
        err = Console(stderr=True)
        with Progress(TextColumn("{task.description:<26}"), BarColumn(), MofNCompleteColumn(),
                      console=err, disable=as_json) as bar:

            def progress(name: str, total: int) -> Callable[[], None]:
                task = bar.add_task(name, total=total)
                return lambda: bar.advance(task)

            results = run(reqs, chosen, base, cpu_x=cpu_x, disk_x=disk_x, policy=policy,
                          progress=progress)
        w = base.weights
        title = (f"{trace.name}: {len(reqs):,} requests, {workers} workers x "
                 f"{capacity_blocks:,} device blocks of {block_size} (cpu {cpu_x:g}x, disk "
                 f"{disk_x:g}x), policy {policy} (credits cpu {w.cpu_credit:.2f}, disk "
                 f"{w.disk_credit:.2f})")
        met = goals(results, cost, block_size)
        if as_json:
            for line in tiers_report.json_lines(results):
                print(line)
        else:
            out = Console()
            tiers_report.print_table(results, title, out if out.is_terminal
                                     else Console(width=200), met)
        if plot is not None:
            err.print(f"plot: {tiers_report.plot(results, plot, title)}")


def _step_overhead(steps: int, batch: int, prompt_tokens: int, block_size: int, cpu_x: float,
                   kv_scale: int, link_us: float, as_json: bool) -> None:
    import json

    from rich.console import Console

    from bench.tiers import steps as step_bench

    res = step_bench.measure(step_bench.model(kv_scale), block_size=block_size, batch=batch,
                             prompt_tokens=prompt_tokens, steps=steps, cpu_x=cpu_x,
                             link_us_per_block=link_us)
    if as_json:
        for r in res:
            print(json.dumps(r.summary(res[0])))
        return
    title = (f"step overhead of offloads: tiny model (KV heads x{kv_scale}), {batch} fresh "
             f"prompts of {prompt_tokens} tokens a step, blocks of {block_size}, CPU tier "
             f"{cpu_x:g}x, {steps} steps each, turn by turn"
             + (f", link emulated +{link_us:g} us per offloaded block" if link_us else ""))
    step_bench.report(res, title, Console(width=160))
