"""`kvmesh bench fleet`: N simulated workers publishing real KV events through the real service
link to a real service over one Redis or an S-shard Redis Cluster, while routes arrive.

Parts: :mod:`.sim` (a worker: real KV cache manager fed by a trace, real ``ServiceLink``),
:mod:`.shards` (per-shard ``INFO commandstats`` / ``INFO cpu``), :mod:`.run` (the phases).
Reports, per phase: event lag (p50/p99/max), route latency (p50/p99), and per shard the
Redis microseconds per applied (block, worker) entry and per route, and its keys.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer

from kvmesh.ops import cli_options as opt

__all__ = ["print_report", "register"]


def _f(x: float, digits: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{digits}f}"


def print_report(res: dict[str, Any]) -> None:
    """The run as plain tables (what ``--json`` prints as one object)."""
    c = res["config"]
    print(f"fleet: {c['workers']} workers x {c['tokens_per_s']:,.0f} prefill tokens/s, "
          f"routes {c['routes_per_s']:g}/s of <= {c['route_tokens']:,} tokens, "
          f"{c['shards']} Redis shard(s), "
          f"{c['service_replicas']} service replica(s); phases of {c['phase_s']:g} s; "
          f"trace {c['trace'] or 'synthetic (one shared first chunk)'}")
    print(f"{'phase':<8}{'entries':>9}{'entries/s':>11}{'lag p50':>9}{'p99':>9}{'max ms':>9}"
          f"{'routes':>8}{'p50 ms':>8}{'p99 ms':>8}{'degr':>6}{'err':>5}  Redis usec per shard")
    for p in res["phases"]:
        usec = " ".join(f"{s['usec']:>9,}" for s in p["shards"])
        print(f"{p['phase']:<8}{p['entries']:>9,}{p['entries'] / p['wall_s']:>11,.0f}"
              f"{_f(p['event_lag_p50_ms']):>9}{_f(p['event_lag_p99_ms']):>9}"
              f"{_f(p['event_lag_max_ms']):>9}{p.get('routes', 0):>8,}"
              f"{_f(p.get('route_p50_ms', float('nan')), 2):>8}"
              f"{_f(p.get('route_p99_ms', float('nan')), 2):>8}{p.get('degraded', 0):>6}"
              f"{p.get('errors', 0):>5}  {usec}")
    for what, digits in (("entry", 2), ("route", 1)):
        for key, label in (("usec", "commandstats"), ("cpu_usec", "process CPU")):
            xs = res[f"{key}_per_{what}"]
            print(f"Redis usec per {what} ({label}), per shard: "
                  + " ".join(_f(x, digits) for x in xs) + f"  (total {_f(sum(xs), digits)})")
    routed = next(p for p in res["phases"] if p["phase"] == "routes")
    print(f"routes: {routed['route_tokens']:,.0f} prompt tokens on average; entries per "
          f"worker per second (events phase): "
          f"{res['entries_per_s'] / c['workers']:,.0f}")
    print(f"service CPU usec per entry {_f(res['service_usec_per_entry'], 2)}, per route "
          f"{_f(res['service_usec_per_route'], 1)} (all replicas)")
    print(f"keys per shard: {res['keys']}; hit rate {res['hit_rate']:.1%}; "
          f"resyncs {res['resyncs']}, outbox overflows {res['overflows']}")


def register(bench: typer.Typer) -> None:
    """Add the ``fleet`` command to the ``kvmesh bench`` group."""

    @bench.command("fleet")
    def fleet(
        workers: int = typer.Option(8, min=1, help="simulated workers"),
        shards: str = typer.Option("1", help="Redis shards (1: one server; more: an "
                                   "embedded Valkey cluster of that many primaries); a list "
                                   "(1,3) runs each and compares them"),
        tokens_per_s: float = typer.Option(20_000, min=1, help="prefilled tokens per worker "
                                           "per second (an 8B model on one H100: ~20K)"),
        routes_per_s: float = typer.Option(50, min=0.1, help="routes per second (open loop)"),
        route_tokens: int = typer.Option(8192, min=16, help="a routed prompt's tokens at "
                                         "most (its first ones)"),
        phase_s: float = typer.Option(3.0, min=0.5, help="seconds per phase"),
        warmup_s: float = typer.Option(2.0, min=0, help="publishing before the phases"),
        num_blocks: int = typer.Option(2048, min=64, help="KV blocks per worker"),
        service_replicas: int = typer.Option(1, min=1, help="service processes"),
        trace: Path = typer.Option(None, exists=True, dir_okay=False,
                                   help="Mooncake-format trace (default: a synthetic one "
                                   "where every prompt shares its first chunk)"),
        limit: int = typer.Option(2000, min=1, help="trace requests read"),
        as_json: bool = typer.Option(False, "--json", help="one JSON object"),
        insecure_cluster_bus: opt.InsecureClusterBus = False,
    ) -> None:
        """Simulated workers publish real KV events while routes arrive: event lag, route
        p50/p99, Redis time per entry and per route, per shard."""
        from bench.fleet.compare import compare, print_comparison
        from bench.fleet.run import FleetConfig, run
        from deploy.redis_cluster import InsecureClusterBus

        try:
            counts = [int(x) for x in shards.split(",")]
        except ValueError:
            counts = []
        if not counts or min(counts) < 1:
            raise typer.BadParameter(f"{shards!r}: shard counts >= 1, comma separated",
                                     param_hint="--shards")
        results = []
        for n in counts:
            cfg = FleetConfig(workers=workers, shards=n, tokens_per_s=tokens_per_s,
                              routes_per_s=routes_per_s, route_tokens=route_tokens,
                              phase_s=phase_s, warmup_s=warmup_s, num_blocks=num_blocks,
                              service_replicas=service_replicas, trace=trace, limit=limit,
                              insecure_cluster_bus=insecure_cluster_bus)
            try:
                results.append(run(cfg))
            except (RuntimeError, InsecureClusterBus) as e:
                typer.echo(f"fleet: {e}", err=True)
                raise typer.Exit(1) from e
            if not as_json:
                print_report(results[-1])
        if len(results) == 1:
            if as_json:
                print(json.dumps(results[0], default=str))
            return
        cmp = compare(results)
        if as_json:
            print(json.dumps(cmp, default=str))
        else:
            print_comparison(cmp)
