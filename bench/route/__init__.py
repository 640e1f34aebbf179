"""`kvmesh bench route`: Route latency through the real client for short and long prompts.

The command and its tables (pieces: ``fleet``, ``measure``, ``breakdown``, ``serve``). Real
Valkey and two service processes (shipped, and without the hash memo), protocol workers
holding 16-, 2,048- and 8,192-token chains; reported through ``KvmeshClient``: latency per
size, routes/s with the CPU each process spent, and where the time goes.

See docs/architecture.md#index-route-and-bridge-benches.
"""
from __future__ import annotations

import json
from typing import Any

import typer

from bench.route.measure import run

__all__ = ["goals", "own_cpu_us", "register", "run"]


def own_cpu_us(row: dict[str, Any]) -> float:
    """The service's own work on one route, each step timed alone: parse + validate, hashing
    through the memo, ranking + the answer (the lookup's Redis client and gRPC excluded)."""
    return row["parse_validate_us"] + row["hash_memo_us"] + row["rank_us"]


def _print_table(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 160))  # wide tables, even in a pipe
    base = res.get("baseline")
    variants = {"": "shipped", "_nomemo": "memo off", **({"_base": "baseline"} if base else {})}
    t = Table(title=f"Route through KvmeshClient: {res['workers']} protocol workers, redis "
                    f"backend, {res['routes_per_size']} dry-run routes per size and service, "
                    "interleaved" + (f"; baseline: the service of {base}, old token_ids field"
                                     if base else ""))
    t.add_column("prompt tokens", justify="right")
    t.add_column("replica")
    for col in ("p50 ms", "p99 ms", "p50 / 16-tok", f"routes/s ({res['threads']} thr)",
                "service CPU ms/route", "Redis CPU ms/route", "client CPU ms/route",
                "handler ms"):
        t.add_column(col, justify="right")
    for r in res["sizes"]:
        for v, name in variants.items():
            t.add_row(f"{r['tokens']:,}", name, f"{r['p50_ms' + v]:.2f}",
                      f"{r['p99_ms' + v]:.2f}", f"{r['ratio_p50' + v]:.2f}x",
                      f"{r['routes_per_s' + v]:,.0f}", f"{r['cpu_ms_service' + v]:.3f}",
                      f"{r['cpu_ms_redis' + v]:.3f}", f"{r['cpu_ms_client' + v]:.3f}",
                      f"{r['handler_ms' + v]:.3f}")
    console.print(t)
    b = Table(title="Where the time goes (µs, each step timed alone in one process)")
    for col in ("prompt tokens", "client build+serialize", "service parse+validate",
                "hashing cold", "hashing memo hit", "rank + answer", "service own",
                "Redis µs (lookup)", "lookup round trip", "response", "p50 live ms"):
        b.add_column(col, justify="right")
    for r in res["sizes"]:
        b.add_row(f"{r['tokens']:,}", f"{r['client_build_us']:.0f}",
                  f"{r['parse_validate_us']:.0f}", f"{r['hash_cold_us']:.0f}",
                  f"{r['hash_memo_us']:.0f}", f"{r['rank_us']:.0f}",
                  f"{own_cpu_us(r):.0f}", f"{r['lookup_server_us']:.0f}",
                  f"{r['lookup_us']:.0f}", f"{r['response_us']:.0f}",
                  f"{r['p50_ms_live']:.2f}")
    console.print(b)
    for line in goals(res):
        console.print(line)


def goals(res: dict[str, Any]) -> list[str]:
    """One line per goal of the route path, met or missed, for the largest prompt."""
    first, last = res["sizes"][0], res["sizes"][-1]
    big, small = f"{last['tokens']:,}-token", f"{first['tokens']}-token"

    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    own = own_cpu_us(last) / 1e3
    lines = [
        f"{big} / {small} p50: {last['ratio_p50']:.2f}x (goal <= {res['goal_ratio_8k']}x): "
        f"{verdict(last['ratio_p50'] <= res['goal_ratio_8k'])}; memo off "
        f"{last['ratio_p50_nomemo']:.2f}x",
        f"service's own CPU per {big} route (parse + validate + hash + rank): {own:.3f} ms "
        f"(goal <= {res['goal_own_cpu_ms']} ms): {verdict(own <= res['goal_own_cpu_ms'])}; "
        f"the whole service process: {last['cpu_ms_service']:.3f} ms a route, "
        f"{first['cpu_ms_service']:.3f} ms for a {small} one (gRPC, Redis client)"]
    if res.get("baseline"):
        gain = last["routes_per_s"] / last["routes_per_s_base"]
        lines.append(
            f"{big} routes/s: {last['routes_per_s']:,.0f} vs the baseline's "
            f"{last['routes_per_s_base']:,.0f} ({gain:.2f}x, goal >= {res['goal_rps_gain']}x): "
            f"{verdict(gain >= res['goal_rps_gain'])}; service CPU per route "
            f"{last['cpu_ms_service']:.3f} vs {last['cpu_ms_service_base']:.3f} ms "
            f"({last['cpu_ms_service_base'] / last['cpu_ms_service']:.2f}x fewer)")
    return lines


def register(bench: typer.Typer) -> None:
    @bench.command("route")
    def route(workers: int = typer.Option(8, help="fake workers (gRPC protocol only, no model)"),
              routes: int = typer.Option(400, help="dry-run routes per prompt size"),
              threads: int = typer.Option(4, help="threads sharing the client for routes/s"),
              duration_s: float = typer.Option(2.0, help="seconds of each routes/s run"),
              baseline: str = typer.Option(
                  "", help="root of another source tree (e.g. a checkout of main): its "
                  "service runs as a third replica, routed with the old token_ids field"),
              as_json: bool = typer.Option(False, "--json")) -> None:
        """Route latency for 16, 2K and 8K-token prompts through the client, routes/s, and
        the CPU each process spends per route."""
        res = run(workers=workers, routes=routes, threads=threads, duration_s=duration_s,
                  baseline=baseline or None)
        if as_json:
            print(json.dumps(res))
        else:
            _print_table(res)
