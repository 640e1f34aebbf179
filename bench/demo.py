"""`kvmesh demo`: what prefix-aware routing does for a realistic workload, in minutes.

For each policy, on a FRESH local cluster (embedded Valkey, the service, N tiny-model
workers): replay the same seeded workload (tenants with salts sharing long system prompts,
RAG templates with popular documents, multi-turn chats whose history grows), sessions
arriving concurrently (open loop). Then one table per policy, a PNG comparing them, and a
two-line verdict (80 columns) as ratios of kvmesh over round robin.

The default load (360 requests, 10 sessions/s, 384 blocks per worker) saturates round robin
on 2 cores and not kvmesh, so the throughput ratio shows what routing buys; both policies
together finish within about two minutes there, cluster starts included.

TTFT is measured on the worker (queueing + prefill), so it shows what routing saves.
"""
from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass

import typer

from bench import workload
from bench.workload import Session, WorkloadSpec
from kvmesh.contract import KVMESH, ROUND_ROBIN


@dataclass(frozen=True)
class Record:
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft_s: float
    worker: str


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    records: list[Record]
    wall_s: float

    @property
    def hit_rate(self) -> float:
        total = sum(r.prompt_tokens for r in self.records)
        return sum(r.cached_tokens for r in self.records) / total if total else 0.0

    @property
    def mean_ttft(self) -> float:
        return statistics.fmean(r.ttft_s for r in self.records)

    @property
    def p90_ttft(self) -> float:
        ttfts = sorted(r.ttft_s for r in self.records)
        return ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))]

    @property
    def tokens_per_s(self) -> float:
        """Prompt + output tokens served per wall-clock second."""
        return sum(r.prompt_tokens + r.output_tokens for r in self.records) / self.wall_s

    @property
    def spread(self) -> dict[str, int]:
        """Requests per worker."""
        out: dict[str, int] = {}
        for r in self.records:
            out[r.worker] = out.get(r.worker, 0) + 1
        return dict(sorted(out.items()))


async def replay(addresses: list[str], sessions: list[Session], policy: str,
                 on_done=None) -> PolicyResult:
    """Run every session (turns in order, sessions concurrently) through the kvmesh client."""
    from client import AsyncKvmeshClient

    records: list[Record] = []
    async with AsyncKvmeshClient(addresses) as client:
        t0 = time.perf_counter()

        async def run(s: Session) -> None:
            await asyncio.sleep(max(0.0, s.arrival_s - (time.perf_counter() - t0)))
            history = list(s.prefix)
            for turn in s.turns:
                history += turn.new_tokens
                res = await client.generate(history, max_tokens=turn.max_tokens, salt=s.salt,
                                            policy=policy, ignore_eos=True)
                records.append(Record(len(history), res.num_cached_tokens, len(res.token_ids),
                                      res.ttft_s, res.worker_id))
                if s.chat:
                    history += res.token_ids
                if on_done is not None:
                    on_done()

        await asyncio.gather(*(run(s) for s in sessions))
        return PolicyResult(policy, records, time.perf_counter() - t0)


def run_demo(policies: list[str], spec: WorkloadSpec, workers: int, model: str,
             num_blocks: int | None, plot: str | None, console) -> list[PolicyResult]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from deploy.local import ClusterSpec, LocalCluster

    sessions = workload.sessions(spec)
    total = sum(len(s.turns) for s in sessions)
    results = []
    with Progress(TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(),
                  console=console, transient=False) as progress:
        for policy in policies:
            task = progress.add_task(f"{policy}: starting", total=total)
            with LocalCluster(ClusterSpec(workers=workers, model=model, num_blocks=num_blocks,
                                          policy=policy)) as cluster:
                progress.update(task, description=f"{policy}: replaying")
                res = asyncio.run(replay(cluster.service_addresses, sessions, policy,
                                         on_done=lambda t=task: progress.advance(t)))
            progress.update(task, description=f"{policy}: done")
            results.append(res)
    for res in results:
        console.print(result_table(res))
    if plot:
        write_plot(results, plot)
        console.print(f"wrote {plot}")
    return results


def result_table(res: PolicyResult):
    from rich.table import Table

    t = Table(title=f"policy: {res.policy}", title_justify="left")
    for col in ("requests", "token hit rate", "mean TTFT", "p90 TTFT", "tokens/s",
                "requests per worker"):
        t.add_column(col, justify="right")
    t.add_row(str(len(res.records)), f"{res.hit_rate:.1%}", f"{res.mean_ttft * 1e3:.0f} ms",
              f"{res.p90_ttft * 1e3:.0f} ms", f"{res.tokens_per_s:,.0f}",
              " ".join(str(n) for n in res.spread.values()))
    return t


def write_plot(results: list[PolicyResult], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.policy for r in results]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    panels = [("token hit rate (%)", [100 * r.hit_rate for r in results]),
              ("mean TTFT (ms)", [1e3 * r.mean_ttft for r in results]),
              ("throughput (tokens/s)", [r.tokens_per_s for r in results])]
    for ax, (title, values) in zip(axes, panels, strict=True):
        ax.bar(names, values, color=["#2a7" if n == "kvmesh" else "#999" for n in names])
        ax.set_title(title)
        for i, v in enumerate(values):
            ax.text(i, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=8)
    fig.suptitle("kvmesh demo: same workload, fresh caches, per routing policy")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def verdict(results: list[PolicyResult]) -> str:
    """Two lines of at most 80 columns: the ratios, then the figures behind them."""
    by = {r.policy: r for r in results}
    k, rr = by.get(KVMESH), by.get(ROUND_ROBIN)
    if k is None or rr is None:
        return "verdict: run with both kvmesh and round_robin to compare"
    hit = k.hit_rate / rr.hit_rate if rr.hit_rate else float("inf")
    return (f"verdict: kvmesh vs round robin: throughput "
            f"{k.tokens_per_s / rr.tokens_per_s:.2f}x, mean TTFT "
            f"{rr.mean_ttft / k.mean_ttft:.1f}x lower\n"
            f"         token hit rate {k.hit_rate:.0%} vs {rr.hit_rate:.0%} ({hit:.2f}x), "
            f"mean TTFT {k.mean_ttft * 1e3:.0f} vs {rr.mean_ttft * 1e3:.0f} ms")

def register(app: typer.Typer) -> None:
    """Add ``demo`` to the top-level ``kvmesh`` group."""

    @app.command("demo")
    def demo(
        requests: int = typer.Option(360, help="requests in the workload"),
        workers: int = typer.Option(3, help="worker processes per cluster"),
        model: str = typer.Option("tiny", help="'tiny' or a Hugging Face model directory"),
        policies: str = typer.Option("kvmesh,round_robin",
                                     help="comma-separated; each runs on a fresh cluster"),
        rate: float = typer.Option(10.0, help="session arrivals per second (the default "
                                   "saturates round robin on 2 cores, not kvmesh)"),
        num_blocks: int = typer.Option(384, help="KV blocks per worker (cache pressure)"),
        plot: str = typer.Option("kvmesh-demo.png", help="PNG comparing the policies"),
        seed: int = typer.Option(0, help="workload seed"),
    ) -> None:
        """Replay a multi-tenant prefix-sharing workload under each policy and compare."""
        from rich.console import Console

        from deploy.stopping import guard_command

        guard = guard_command()  # SIGTERM: its clusters stop within the deadline, nothing left
        console = Console()
        names = [p.strip() for p in policies.split(",") if p.strip()]
        try:
            results = run_demo(names, WorkloadSpec(requests=requests, rate_per_s=rate,
                                                   seed=seed),
                               workers, model, num_blocks, plot or None, console)
        except Exception as exc:  # the cluster failed: say so and exit non-zero
            console.print(f"[red]demo failed:[/red] {exc}")
            raise typer.Exit(1) from None
        finally:
            if guard is not None:  # run in-process (a test): the process is put back
                guard.uninstall()
        console.print(verdict(results))
