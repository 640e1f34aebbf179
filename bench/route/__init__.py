"""`kvmesh bench route`: Route latency through the real client for short and long prompts.

This module is the command and its tables; the pieces: :mod:`bench.route.fleet` (protocol
workers and the indexed prompts), :mod:`bench.route.measure` (the run),
:mod:`bench.route.breakdown` (where the time goes), :mod:`bench.route.serve` (the service
child process).

Setup, all real: a Valkey server, two replicas of the metadata service over it, each its own
process (``create_server``, redis backend, default settings, run by ``python -m
bench.route.serve``): the service as shipped and the same with its block-hash memo replaced
by plain hashing (what the memo buys, side by side). ``workers`` protocol workers register,
heartbeat and publish BlockStored events over gRPC exactly like real ones (no model: this
measures the service). Three prompts of 16, 2,048 and 8,192 tokens are indexed: worker ``i``
of ``W`` holds the first ``ceil((i + 1) / W)`` of each chain, so the lookup walks every block
with a candidate set that shrinks as it goes, and the last worker holds the whole prompt.

Measured through ``client.KvmeshClient`` (one client per replica), sizes and replicas
interleaved by rounds so all see the same machine load:

- p50 / p99 of ``route(dry_run=True)`` per size (nothing changes between calls), then one
  pass without ``dry_run`` on the shipped replica (provisional entries and load accounting);
- the ratio of each size's p50 to the 16-token p50 (goal: 8K <= 2.5x);
- routes/s with ``threads`` threads sharing the client, per size;
- where the time goes, per size: the service's own handler time (its Prometheus histogram:
  sum / count over the dry-run pass), and each step of a route timed alone in this process:
  request build + serialize (client), parse + validate (service), block hashing (service;
  cold and through its memo), the Lua lookup (in Redis and round trip), response parsing.
"""
from __future__ import annotations

import json
from typing import Any

import typer

from bench.route.measure import run

__all__ = ["register", "run"]


def _print_table(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 160))  # wide tables, even in a pipe
    t = Table(title=f"Route through KvmeshClient: {res['workers']} protocol workers, redis "
                    f"backend, {res['routes_per_size']} dry-run routes per size and service, "
                    "interleaved")
    for col in ("prompt tokens", "p50 ms", "p99 ms", "p50 / 16-tok",
                f"routes/s ({res['threads']} thr)", "p50 ms (live)", "p99 ms (live)",
                "memo off: p50 ms", "p99 ms", "p50 / 16-tok", "routes/s"):
        t.add_column(col, justify="right")
    for r in res["sizes"]:
        t.add_row(f"{r['tokens']:,}", f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}",
                  f"{r['ratio_p50']:.2f}x", f"{r['routes_per_s']:,.0f}",
                  f"{r['p50_ms_live']:.2f}", f"{r['p99_ms_live']:.2f}",
                  f"{r['p50_ms_nomemo']:.2f}", f"{r['p99_ms_nomemo']:.2f}",
                  f"{r['ratio_p50_nomemo']:.2f}x", f"{r['routes_per_s_nomemo']:,.0f}")
    console.print(t)
    b = Table(title="Where the time goes (µs, each step timed alone; handler = the service's "
                    "own mean)")
    for col in ("prompt tokens", "client build+serialize", "service parse+validate",
                "hashing cold", "hashing memo hit", "Lua in Redis", "lookup round trip",
                "response", "handler", "handler memo off", "client p50"):
        b.add_column(col, justify="right")
    for r in res["sizes"]:
        b.add_row(f"{r['tokens']:,}", f"{r['client_build_us']:.0f}",
                  f"{r['parse_validate_us']:.0f}", f"{r['hash_cold_us']:.0f}",
                  f"{r['hash_memo_us']:.0f}", f"{r['lua_server_us']:.0f}",
                  f"{r['lookup_us']:.0f}", f"{r['response_us']:.0f}",
                  f"{r['handler_ms'] * 1e3:.0f}", f"{r['handler_ms_nomemo'] * 1e3:.0f}",
                  f"{r['p50_ms'] * 1e3:.0f}")
    console.print(b)
    last = res["sizes"][-1]
    ok = "met" if last["ratio_p50"] <= res["goal_ratio_8k"] else "MISSED"
    console.print(f"{last['tokens']:,}-token / {res['sizes'][0]['tokens']}-token p50: "
                  f"{last['ratio_p50']:.2f}x (goal <= {res['goal_ratio_8k']}x): {ok}; "
                  f"without the hash memo {last['ratio_p50_nomemo']:.2f}x")


def register(bench: typer.Typer) -> None:
    @bench.command("route")
    def route(workers: int = typer.Option(8, help="fake workers (gRPC protocol only, no model)"),
              routes: int = typer.Option(400, help="dry-run routes per prompt size"),
              threads: int = typer.Option(4, help="threads sharing the client for routes/s"),
              duration_s: float = typer.Option(2.0, help="seconds of each routes/s run"),
              as_json: bool = typer.Option(False, "--json")) -> None:
        """Route latency for 16, 2K and 8K-token prompts through the client, and routes/s."""
        res = run(workers=workers, routes=routes, threads=threads, duration_s=duration_s)
        if as_json:
            print(json.dumps(res))
        else:
            _print_table(res)
