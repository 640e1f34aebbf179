"""Reporting a replay: JSON lines, a rich table, the targets below, and a comparison plot.

The targets compare ``kvmesh`` with the others from ONE run: token hit rate >= 2x
``round_robin``'s and at least the peers' (``approx_tree``, ``ray_prefix_tree``), within
0.01 of the pooled ``oracle``'s; load imbalance <= 1.3; the lowest p90 TTFT of all policies
(``oracle`` is a bound, not a policy, and is left out of that comparison); against each
revision row ``kvmesh@REV``, a hit rate at least REV's and a p99 TTFT no worse (so
every change to the cost model is judged before and after in one run); the peer-fetch row
``kvmesh+fetch``: a hit rate >= 99% of the oracle's and a mean TTFT >= 15% below plain
``kvmesh``'s. Checks whose rows did not run are skipped. Rows of the ``kvmesh`` policy
other than the plain one (variants ``kvmesh[...]``, revisions, ``kvmesh+fetch``:
:mod:`.rows`) are never rivals.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvmesh.contract import ROUND_ROBIN

from .replay import PolicyResult
from .rows import base_policy

BOUND = "oracle"
FETCH_ROW = "kvmesh+fetch"


def json_lines(results: Sequence[PolicyResult]) -> list[str]:
    """One JSON object per policy (the ``--json`` output)."""
    return [json.dumps(r.summary()) for r in results]


def targets(results: Sequence[PolicyResult]) -> list[tuple[str, bool, str]]:
    """(target, met, figures) for each target whose policies are in ``results``."""
    by = {r.policy: r for r in results}
    k = by.get("kvmesh")
    if k is None:
        return []
    out: list[tuple[str, bool, str]] = []
    hit = k.token_hit_rate
    for other, factor in ((ROUND_ROBIN, 2.0), ("approx_tree", 1.0), ("ray_prefix_tree", 1.0)):
        r = by.get(other)
        if r is None:
            continue
        ratio = hit / r.token_hit_rate if r.token_hit_rate else float("inf")
        out.append((f"hit rate >= {factor:g}x {other}", ratio >= factor,
                    f"{hit:.4f} / {r.token_hit_rate:.4f} = {ratio:.2f}x"))
    bound = by.get(BOUND)
    if bound is not None:
        gap = bound.token_hit_rate - hit
        out.append(("hit rate within 0.01 of oracle", gap <= 0.01,
                    f"{hit:.4f} vs {bound.token_hit_rate:.4f} ({abs(gap):.4f} "
                    f"{'below' if gap > 0 else 'above'})"))
    for r in results:
        if "@" in r.policy and base_policy(r.policy) == "kvmesh":
            out.append((f"hit rate >= {r.policy}", hit >= r.token_hit_rate,
                        f"{hit:.4f} vs {r.token_hit_rate:.4f}"))
            out.append((f"p99 TTFT <= {r.policy}", k.ttft_s(99) <= r.ttft_s(99),
                        f"{k.ttft_s(99):.3f}s vs {r.ttft_s(99):.3f}s"))
    f = by.get(FETCH_ROW)
    if f is not None:
        if bound is not None and bound.token_hit_rate:
            ratio = f.token_hit_rate / bound.token_hit_rate
            out.append(("fetch: hit rate >= 0.99x oracle", ratio >= 0.99,
                        f"{f.token_hit_rate:.4f} / {bound.token_hit_rate:.4f} = {ratio:.4f}x"))
        if k.ttft_s():
            cut = 1 - f.ttft_s() / k.ttft_s()
            out.append(("fetch: mean TTFT >= 15% below kvmesh", cut >= 0.15,
                        f"{f.ttft_s():.3f}s vs {k.ttft_s():.3f}s ({cut:+.1%} cut)"))
    out.append(("load imbalance <= 1.3", k.load_imbalance <= 1.3, f"{k.load_imbalance:.3f}"))
    rivals = [r for r in results if base_policy(r.policy) not in ("kvmesh", BOUND)]
    if rivals:
        p90 = k.ttft_s(90)
        best = min(rivals, key=lambda r: r.ttft_s(90))
        bp90 = best.ttft_s(90)
        out.append(("lowest p90 TTFT", p90 <= bp90,
                    f"kvmesh {p90:.3f}s, best other {best.policy} {bp90:.3f}s"))
    return out


def print_table(results: Sequence[PolicyResult], title: str, console: Console) -> None:
    """The human-readable table, then the targets."""
    rr = next((r.token_hit_rate for r in results if r.policy == ROUND_ROBIN), 0.0)
    table = Table(title=title)
    fetch = any(r.fetches.fetches for r in results)
    cols = ("policy", "requests", "hit rate", *(("peer", "fetches") if fetch else ()), "x rr",
            "imbalance", "prefill tok", "mean TTFT s", "p90 TTFT s", "p99 TTFT s", "util",
            "evictions", "wall s")
    for col in cols:
        if col == "policy":  # labels of variants differ at their end: fold, never cut
            table.add_column(col, justify="left", overflow="fold")
        else:
            table.add_column(col, justify="right")
    for r in results:
        # a variant's "[weight=value]" is text, not rich markup
        name = f"{r.policy} (bound)" if r.policy == BOUND else escape(r.policy)
        util = r.summary()["utilization"]
        peer = ((f"{r.hit_by_tier.get('peer', 0) / r.prompt_tokens:.2%}"
                 if r.prompt_tokens else "-"),
                f"{r.fetches.fetches:,} ({r.fetches.blocks:,} bl)") if fetch else ()
        table.add_row(name, f"{r.requests:,}" + (f" (-{r.rejected})" if r.rejected else ""),
                      f"{r.token_hit_rate:.2%}", *peer,
                      f"{r.token_hit_rate / rr:.2f}" if rr else "-",
                      f"{r.load_imbalance:.2f}", f"{r.prefill_tokens:,}",
                      f"{r.ttft_s():.2f}", f"{r.ttft_s(90):.2f}", f"{r.ttft_s(99):.2f}",
                      f"{util:.0%}",
                      f"{r.evictions:,}", f"{r.wall_s:.0f}")
    console.print(table)
    for name, ok, detail in targets(results):
        mark = "[green]met[/]" if ok else "[red]MISSED[/]"
        console.print(f"  {mark}  {name}: {detail}")


def plot(results: Sequence[PolicyResult], path: str | Path, title: str) -> Path:
    """A PNG comparing the policies: hit rate, load imbalance, TTFT (mean, p90) and the TTFT
    distribution. The oracle is drawn hatched (a bound). Needs matplotlib (dev extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = [r.policy for r in results]
    x = np.arange(len(results))
    hatch = ["//" if n == BOUND else "" for n in names]
    colors = ["tab:green" if n == "kvmesh" else "tab:gray" if n == BOUND else "tab:blue"
              for n in names]
    fig, ax = plt.subplots(2, 2, figsize=(13, 8.5))

    def bars(a: Any, values: list[float], label: str, fmt: str) -> None:
        bs = a.bar(x, values, color=colors, hatch=hatch, edgecolor="black", linewidth=0.5)
        a.bar_label(bs, [fmt.format(v) for v in values], fontsize=8)
        a.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
        a.set_title(label)

    bars(ax[0, 0], [r.token_hit_rate * 100 for r in results], "token hit rate (%)", "{:.1f}")
    bars(ax[0, 1], [r.load_imbalance for r in results],
         "load imbalance (max/mean prefill tokens per worker)", "{:.2f}")
    ax[0, 1].axhline(1.3, color="red", linestyle="--", linewidth=0.8)
    width = 0.4
    means = [r.ttft_s() for r in results]
    p90s = [r.ttft_s(90) for r in results]
    a = ax[1, 0]
    a.bar(x - width / 2, means, width, label="mean", color="tab:cyan", hatch=hatch)
    a.bar(x + width / 2, p90s, width, label="p90", color="tab:orange", hatch=hatch)
    a.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
    a.set_yscale("log")
    a.set_title("estimated TTFT (s, log)")
    a.legend(fontsize=8)
    a = ax[1, 1]
    for r in results:
        if r.ttfts:
            t = np.sort(np.asarray(r.ttfts))
            a.plot(t, np.arange(1, len(t) + 1) / len(t), label=r.policy,
                   linewidth=2 if r.policy == "kvmesh" else 1,
                   linestyle=":" if r.policy == BOUND else "-")
    a.set_xscale("log")
    a.set_xlabel("TTFT (s)")
    a.set_title("TTFT CDF")
    a.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
