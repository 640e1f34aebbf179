"""`kvmesh bench index`: the Redis index at scale (events/s, lookup latency, memory/entry).

The measuring lives in :mod:`bench.index.run`, the synthetic index in
:mod:`bench.index.data`, the per-block pipelined lookup it is compared with in
:mod:`bench.index.pipelined`; this module is the command and its table.
"""
from __future__ import annotations

import json
from typing import Any

import typer


def _print(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 160))  # wide tables, even in a pipe
    t = Table(title=f"Redis index: {res['entries']:,} (block, worker) entries, "
                    f"{res['distinct_blocks']:,} blocks, {res['workers']} workers")
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_column("goal", justify="right")
    mem_ok = "met" if res["bytes_per_entry"] <= res["goal_bytes_per_entry"] else "MISSED"
    rows = [
        ("events applied / s (BlockStored of "
         f"{res['event_blocks']} blocks, {res['batch_events']} per batch)",
         f"{res['events_per_s']:,.0f}", ""),
        ("batches (apply_events calls) / s", f"{res['batches_per_s']:,.0f}", ""),
        ("entries indexed / s", f"{res['entries_per_s']:,.0f}", ""),
        ("Redis time per entry applied (Lua, commandstats)",
         f"{res['apply_server_us_per_entry']:.2f} µs",
         f"<= 2.5 µs (400K / s / core): "
         f"{'met' if res['apply_server_us_per_entry'] <= 2.5 else 'MISSED'}"),
        ("Redis time per entry removed (Lua, commandstats)",
         f"{res['remove_server_us_per_entry']:.2f} µs", ""),
        ("Redis process CPU per entry applied (INFO cpu)",
         f"{res['apply_cpu_us_per_entry']:.2f} µs", ""),
        ("Redis process CPU per entry removed (INFO cpu)",
         f"{res['remove_cpu_us_per_entry']:.2f} µs", ""),
        ("Redis memory per entry", f"{res['bytes_per_entry']:.0f} B",
         f"<= {res['goal_bytes_per_entry']} B ({mem_ok})"),
        ("Redis memory per entry, settled (build connections closed)",
         f"{res['settled_bytes_per_entry']:.0f} B", ""),
        ("  of which block keys (their own allocations)",
         f"{res['block_keys_bytes_per_entry']:.0f} B", ""),
        ("  of which the rest (hash table slots, records)",
         f"{res['other_bytes_per_entry']:.0f} B", ""),
        ("Redis memory per distinct block", f"{res['bytes_per_block']:.0f} B", ""),
        ("Redis time per looked-up block (commandstats)",
         f"{res['lookup_server_us_per_block']:.2f} µs", ""),
        ("Redis process CPU per looked-up block (INFO cpu)",
         f"{res['lookup_cpu_us_per_block']:.2f} µs", ""),
    ]
    for r in rows:
        t.add_row(*r)
    console.print(t)
    lk = Table(title=f"Lookup of a {res['query_blocks']}-block prompt ({res['chain_blocks']} "
                     f"held by up to {res['holders']} workers + new blocks), "
                     f"{res['queries']} queries, interleaved")
    for col in ("lookup", "p50 ms", "p99 ms", "Redis µs / lookup (commandstats)",
                "Redis CPU µs / lookup (INFO cpu)"):
        lk.add_column(col, justify="right")
    for kind, label in (("kvmesh", "kvmesh: one MGET in MULTI/EXEC + walk in the service"),
                        ("pipelined", "pipelined GET per block + walk (llm-d's way)"),
                        ("per_tag", "pipelined MGET per cluster tag + walk")):
        lk.add_row(label, f"{res[kind + '_p50_ms']:.3f}", f"{res[kind + '_p99_ms']:.3f}",
                   f"{res[kind + '_server_us']:.0f}", f"{res[kind + '_cpu_us']:.0f}")
    console.print(lk)
    console.print(f"answers identical: {res['identical']}; equal to the dataset: "
                  f"{res['correct']}; after the evictions: {res['correct_after_evictions']}")


def register(bench: typer.Typer) -> None:
    @bench.command("index")
    def index(entries: int = typer.Option(200_000, help="(block, worker) entries to index; "
                                          "1,000,000 is the documented run"),
              workers: int = typer.Option(64),
              chain_blocks: int = typer.Option(128, help="blocks per shared chain"),
              holders: int = typer.Option(4, help="workers holding (a prefix of) each chain"),
              event_blocks: int = typer.Option(16, help="blocks per BlockStored event"),
              batch_events: int = typer.Option(32, help="events per apply_events batch"),
              queries: int = typer.Option(300, help="lookups of each kind"),
              tail_blocks: int = typer.Option(16, help="new blocks after the held chain"),
              model: str = typer.Option("meta-llama/Llama-3.1-8B-Instruct",
                                        help="model name (part of every key)"),
              as_json: bool = typer.Option(False, "--json")) -> None:
        """The Redis index at scale: events/s, Lua vs pipelined lookups, memory per entry."""
        from bench.index.data import Layout
        from bench.index.run import run

        res = run(entries=entries, layout=Layout(workers, chain_blocks, holders, event_blocks,
                                                 batch_events),
                  queries=queries, tail_blocks=tail_blocks, model=model)
        if as_json:
            print(json.dumps(res))
        else:
            _print(res)
