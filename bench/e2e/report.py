"""Reporting ``kvmesh bench e2e``: the table (rows, then kvmesh's ratios over each other
row), the goals against round robin, and each row's route-log analysis."""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench import route_log
from bench.e2e.outputs import fetch_goals
from bench.e2e.rounds import wins
from kvmesh.contract import CONSISTENT_HASH, LEAST_LOADED, PREFIX_ONLY, ROUND_ROBIN


def _title(res: dict[str, Any]) -> str:
    s = {**res["spec"], **res["spec"]["workload"]}
    cpu_note = f" (+{s['cpu_blocks']} CPU-tier blocks)" if s.get("cpu_blocks") else ""
    hot = (f"; tenant-0 takes {s['hot_share']:.0%} of them" if s.get("hot_share") else "")
    n = res.get("rounds", 1)
    rounds = f"; each row the median of {n} rounds" if n > 1 else ""
    head = (f"e2e: {s['workers']} {res.get('model', 'tiny')}-model workers x "
            f"{s['num_blocks']} blocks{cpu_note}, {s['requests']} requests at "
            f"{s['rate_per_s']}/s (Poisson), {s['tenants']} tenants x {s['system_tokens']}-token "
            "system prompt + ")
    if s.get("kind") == "chats":
        return (head + f"{s['chats_per_tenant']} chats each of {s['turns_per_chat']} turns "
                f"({s['question_tokens']}-token questions, {s['answer_tokens']}-token "
                f"answers joining the history), {s['max_tokens']} out{rounds}")
    return (head + f"{s['question_tokens']}-token question, {s['max_tokens']} out"
            f"{hot}{rounds}")


def _ratio_row(t: Table, name: str, ra: dict[str, float]) -> None:
    t.add_row(escape(name), f"{ra['throughput']:.2f}x", "", "",
              f"{ra['mean_ttft_lower']:.2f}x lower", f"{ra['p90_ttft_lower']:.2f}x lower",
              f"{ra['token_hit_rate']:.2f}x", "", "", "")


def table(res: dict[str, Any]) -> Table:
    """The rows, then ``+cpu / without`` (with the CPU tier) and ``kvmesh / X`` for every
    other row ``X`` (``ratios_over``)."""
    t = Table(title=_title(res))
    cols = ("policy", "tokens/s", "out tok/s", "req/s", "mean TTFT ms", "p90 TTFT ms",
            "token hit rate", "makespan s", "errors", "requests per worker")
    for c in cols:
        t.add_column(c, justify="right")
    for r in res["rows"]:
        # labels are printed as they are: kvmesh[w=0] is no rich markup
        t.add_row(escape(r["policy"]), f"{r['tokens_per_s']:,.0f}",
                  f"{r['output_tokens_per_s']:,.0f}",
                  f"{r['requests_per_s']:.2f}", f"{r['mean_ttft_s'] * 1e3:,.0f}",
                  f"{r['p90_ttft_s'] * 1e3:,.0f}", f"{r['token_hit_rate']:.1%}",
                  f"{r['makespan_s']:.1f}", str(r["errors"]),
                  " ".join(str(n) for n in r["per_worker"].values()))
    cpu = bool(res["spec"].get("cpu_blocks"))
    if res["ratios"] and cpu:
        _ratio_row(t, "+cpu / without", res["ratios"])
    base = "kvmesh+cpu" if cpu else "kvmesh"
    for name, ra in res.get("ratios_over", {}).items():
        _ratio_row(t, f"{base} / {name}", ra)
    return t


def goals(res: dict[str, Any]) -> list[tuple[str, bool]]:
    """The routing-at-saturation goals for plain ``kvmesh`` on this run's rows: when the
    offered load saturates round robin (it served under 90% of it), throughput >= 2x round
    robin's and at least every baseline's (prefix_only, consistent_hash, least_loaded);
    always, the lowest mean TTFT of all rows. Rows that did not run are skipped."""
    rows = {r["policy"]: r for r in res["rows"]}
    k = rows.get("kvmesh")
    if k is None:
        return []
    out = []
    rr = rows.get(ROUND_ROBIN)
    offered = res.get("offered_tokens_per_s", 0.0)
    saturated = rr is None or not offered or rr["tokens_per_s"] < 0.9 * offered
    if rr is not None and saturated:
        ratio = k["tokens_per_s"] / rows[ROUND_ROBIN]["tokens_per_s"]
        out.append((f"throughput >= 2x round_robin ({ratio:.2f}x)", ratio >= 2.0))
    for name in (PREFIX_ONLY, CONSISTENT_HASH, LEAST_LOADED):
        if name in rows and saturated:
            ratio = k["tokens_per_s"] / rows[name]["tokens_per_s"]
            out.append((f"throughput >= {name} ({ratio:.2f}x)", ratio >= 1.0))
    others = [r for r in res["rows"] if r["policy"] != "kvmesh"
              and not r["policy"].startswith(("kvmesh[", "kvmesh@", "kvmesh+"))]
    if others:
        best = min(others, key=lambda r: r["mean_ttft_s"])
        out.append((f"lowest mean TTFT ({k['mean_ttft_s'] * 1e3:,.0f} ms; best other "
                    f"{best['policy']} {best['mean_ttft_s'] * 1e3:,.0f} ms)",
                    k["mean_ttft_s"] <= best["mean_ttft_s"]))
    return out


def spread(res: dict[str, Any]) -> list[str]:
    """With rounds: each row's figures per round, then in how many rounds plain kvmesh (or
    ``kvmesh+cpu``) beat each other row. Nothing for a single round."""
    if res.get("rounds", 1) < 2:
        return []
    out = [f"{r['policy']} by round: " + ", ".join(
        f"{x['tokens_per_s']:,.0f} tok/s {x['mean_ttft_s'] * 1e3:,.0f} ms "
        f"{x['token_hit_rate']:.1%}" for x in r["rounds"]) for r in res["rows"]]
    base = "kvmesh+cpu" if res["spec"].get("cpu_blocks") else "kvmesh"
    rows = {r["policy"]: r for r in res["rows"]}
    if base in rows:
        for name, r in rows.items():
            if name != base:
                w = wins(rows[base], r)
                out.append(f"{base} beat {name} in throughput in {w['throughput']} of "
                           f"{w['rounds']} rounds, in mean TTFT in {w['mean_ttft']}")
    return out


def show(res: dict[str, Any]) -> None:
    """Print :func:`table`, the offered load, CPU-tier shares, goals and route logs."""
    console = Console(width=max(Console().width, 160))  # wide tables, even in a pipe
    console.print(table(res))
    console.print(f"offered load: {res['offered_tokens_per_s']:,.0f} tokens/s")
    for line in spread(res):
        console.print(line, markup=False, soft_wrap=True)
    for r in res["rows"]:
        if r["hit_rate_by_tier"].get("cpu"):
            console.print(f"{r['policy']}: {r['hit_rate_by_tier']['cpu']:.1%} of prompt tokens "
                          "came from the CPU tier", markup=False)
    ra = res["ratios"]
    if ra and res["spec"].get("cpu_blocks"):
        console.print(f"CPU tier: mean TTFT {ra['mean_ttft_lower']:.2f}x lower, p90 "
                      f"{ra['p90_ttft_lower']:.2f}x lower, hit rate {ra['token_hit_rate']:.2f}x")
    elif ra:
        for goal, met in goals(res):
            console.print(f"goal: {goal}: {'met' if met else 'MISSED'}", markup=False)
    for label, ra in res.get("fetch_ratios", {}).items():
        console.print(f"{label} over {label.removesuffix('+fetch')}: throughput "
                      f"{ra['throughput']:.2f}x, mean TTFT {ra['mean_ttft_lower']:.2f}x lower, "
                      f"p90 TTFT {ra['p90_ttft_lower']:.2f}x lower", markup=False)
    for r in res["rows"]:
        if r.get("peer_hit_rate") or r.get("peer", {}).get("fetches"):
            p = r.get("peer", {})
            why = ", ".join(f"{k.removeprefix('fallback:')} {n}" for k, n in sorted(p.items())
                            if k.startswith("fallback:"))
            console.print(f"{r['policy']}: {r['peer_hit_rate']:.1%} of prompt tokens came "
                          f"from a peer; fetches {p.get('fetches', 0)}, fallbacks "
                          f"{p.get('fallbacks', 0)}{f' ({why})' if why else ''}, served "
                          f"{p.get('served', 0)}, refused {p.get('refused', 0)}", markup=False)
    for goal, met in fetch_goals(res.get("fetch_ratios", {})):
        console.print(f"goal: {goal}: {'met' if met else 'MISSED'}", markup=False)
    for label, o in res.get("outputs", {}).items():
        console.print(f"outputs {label}: {o['mismatches']} of {o['compared']} requests differ "
                      "from the first row's", markup=False)
    if res.get("against"):
        console.print(f"kvmesh@{res['against']}: the service and workers of git revision "
                      f"{res['against']}, driven by this bench and client")
    for label, summary in res.get("route_logs", {}).items():
        console.print("route log " + route_log.describe(label, summary), soft_wrap=True,
                      markup=False)
