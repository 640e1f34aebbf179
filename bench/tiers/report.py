"""Reporting ``kvmesh bench tiers``: JSON lines, a table with ratios against ``gpu``, the
tiered cache's goals, and a comparison plot."""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.tiers import BASELINE, BOUND, SetupResult
from kvmesh.contract import LOWER_TIERS, TIERS

TIER_COLORS = dict(zip(TIERS, ("tab:green", "tab:blue", "tab:orange"), strict=True))


def _base(results: Sequence[SetupResult]) -> SetupResult | None:
    return next((r for r in results if r.setup.name == BASELINE), None)


def json_lines(results: Sequence[SetupResult]) -> list[str]:
    """One JSON object per setup (the ``--json`` output), with ratios against ``gpu``."""
    base = _base(results)
    return [json.dumps(r.summary(base)) for r in results]


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f}" if n else "0"


def print_table(results: Sequence[SetupResult], title: str, console: Console,
                goals: Sequence[tuple[str, bool, str]]) -> None:
    """The human-readable table, then the goals."""
    base = _base(results)
    table = Table(title=title)
    cols = ("setup", "hit rate", "x gpu", "hits gpu/cpu/disk", "prefill tok", "mean TTFT s",
            "cut", "p90 TTFT s", "cut", "onboard GB cpu/disk", "offload GB", "spill GB",
            "evictions", "wall s")
    for col in cols:
        table.add_column(col, justify="left" if col == "setup" else "right")
    for r in results:
        table.add_row(
            r.setup.name, f"{r.result.token_hit_rate:.2%}",
            f"{r.hit_x(base):.2f}" if base else "-",
            "/".join(f"{r.hit_share(t):.0%}" for t in TIERS),
            f"{r.result.prefill_tokens:,}", f"{r.result.ttft_s():.3f}",
            f"{r.ttft_cut(base):.0%}" if base else "-", f"{r.result.ttft_s(90):.3f}",
            f"{r.ttft_cut(base, 90):.0%}" if base else "-",
            "/".join(_gb(r.onboard_bytes(t)) for t in LOWER_TIERS),
            _gb(r.bytes_of(r.result.copies.offload_blocks)),
            _gb(r.bytes_of(r.result.copies.spill_blocks)),
            f"{r.result.evictions:,}", f"{r.result.wall_s:.0f}")
    console.print(table)
    for name, ok, detail in goals:
        mark = "[green]met[/]" if ok else "[red]MISSED[/]"
        console.print(f"  {mark}  {name}: {detail}")


def plot(results: Sequence[SetupResult], path: str | Path, title: str) -> Path:
    """A PNG: token hit rate stacked by the tier each hit came from, mean and p90 TTFT,
    bytes moved between tiers, and the TTFT CDF. Needs matplotlib (dev extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = [r.setup.name for r in results]
    x = np.arange(len(results))
    fig, ax = plt.subplots(2, 2, figsize=(13, 8.5))

    a = ax[0, 0]
    bottom = np.zeros(len(results))
    for tier, color in TIER_COLORS.items():
        vals = np.array([r.result.hit_by_tier.get(tier, 0) / max(r.result.prompt_tokens, 1)
                         * 100 for r in results])
        a.bar(x, vals, bottom=bottom, color=color, label=f"from {tier}",
              hatch=["//" if n == BOUND else "" for n in names])
        bottom += vals
    a.bar_label(a.containers[-1], [f"{v:.1f}" for v in bottom], fontsize=8)
    a.set_title("token hit rate (%), by the tier each hit came from")
    a.legend(fontsize=8)

    width = 0.4
    a = ax[0, 1]
    a.bar(x - width / 2, [r.result.ttft_s() for r in results], width, label="mean",
          color="tab:cyan")
    a.bar(x + width / 2, [r.result.ttft_s(90) for r in results], width, label="p90",
          color="tab:purple")
    a.set_title("estimated TTFT (s)")
    a.legend(fontsize=8)

    a = ax[1, 0]
    width = 0.27
    moved = {
        "onboard": [r.onboard_bytes() / 1e9 for r in results],
        "offload": [r.bytes_of(r.result.copies.offload_blocks) / 1e9 for r in results],
        "spill": [r.bytes_of(r.result.copies.spill_blocks) / 1e9 for r in results],
    }
    for i, (label, vals) in enumerate(moved.items()):
        a.bar(x + (i - 1) * width, vals, width, label=label)
    a.set_title("bytes copied between tiers (GB)")
    a.legend(fontsize=8)
    for a in (ax[0, 0], ax[0, 1], ax[1, 0]):
        a.set_xticks(x, names, rotation=30, ha="right", fontsize=8)

    a = ax[1, 1]
    for r in results:
        if r.result.ttfts:
            t = np.sort(np.asarray(r.result.ttfts))
            a.plot(t, np.arange(1, len(t) + 1) / len(t), label=r.setup.name,
                   linewidth=2 if r.setup.name in (BASELINE, "gpu+cpu") else 1,
                   linestyle=":" if r.setup.name == BOUND else "-")
    a.set_xscale("log")
    a.set_xlabel("TTFT (s)")
    a.set_title("TTFT CDF")
    a.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
