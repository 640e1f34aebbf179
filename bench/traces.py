"""`kvmesh bench trace chat OUT.jsonl`: write a synthetic Mooncake-format trace to replay.

The workload itself is ``bench.workload.chat_trace`` (the one workload model of the benches);
this command writes it as JSON lines, one record a line in arrival order, and says what it
holds: requests, tenants, sessions, prompt tokens, and the working set in distinct KV blocks
(what a cache of unlimited size would hold at the end), so a run can be sized against the
cluster's pooled capacity (``kvmesh bench replay --workers W --capacity-blocks B`` pools
``W * B`` blocks).
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import typer

from bench.workload import CHUNK, ChatTraceSpec, chat_trace


def working_set_blocks(records: Iterable[Mapping], block_size: int) -> int:
    """Distinct full KV blocks of ``block_size`` tokens over all prompts of a prefix-dependent
    trace (equal ids follow equal prefixes), per salt.

    Block ``j`` of a prompt is named by its index and the id of the chunk holding its last
    token: that id fixes every token before it. Per (salt, id), the blocks ending in that
    chunk are a run from the chunk's first one, as long as the longest prompt that reaches
    into it makes it; their counts add up.
    """
    reach: dict[tuple[object, int], int] = {}  # (salt, chunk id) -> blocks ending in it
    for rec in records:
        ids, full = rec["hash_ids"], rec["input_length"] // block_size
        for c, h in enumerate(ids):
            first = -(-(c * CHUNK + 1) // block_size) - 1  # first block ending in chunk c
            last = min(((c + 1) * CHUNK) // block_size, full)  # blocks ending by its end
            if last <= first:
                break
            key = (rec.get("salt"), h)
            reach[key] = max(reach.get(key, 0), last - first)
    return sum(reach.values())


def write(records: Iterable[Mapping], out: Path) -> None:
    with open(out, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")


def register(bench: typer.Typer) -> None:
    """Add the ``trace`` group (``trace chat``) to the ``kvmesh bench`` group."""
    group = typer.Typer(no_args_is_help=True,
                        help="Write synthetic Mooncake-format traces for `kvmesh bench replay`.")
    bench.add_typer(group, name="trace")
    base = ChatTraceSpec()

    @group.command("chat")
    def chat(
        out: Path = typer.Argument(..., dir_okay=False, help="the JSONL trace to write"),
        tenants: int = typer.Option(base.tenants, min=1, help="tenants (one salt each)"),
        sessions: int = typer.Option(base.sessions, min=1, help="chat sessions"),
        rate: float = typer.Option(base.session_rate_per_s, min=1e-6,
                                   help="session starts per second (Poisson)"),
        min_turns: int = typer.Option(base.turns[0], min=1, help="turns per session, least"),
        max_turns: int = typer.Option(base.turns[1], min=1, help="turns per session, most"),
        zipf: float = typer.Option(base.zipf, min=0.0, help="tenant popularity exponent "
                                   "(0: uniform)"),
        seed: int = typer.Option(base.seed, help="the trace's seed"),
        block_size: int = typer.Option(16, min=1, help="block size of the working-set count"),
    ) -> None:
        """A multi-tenant chat trace: tenants' shared system prompts, long multi-turn chats
        (each turn resends the whole history), think time, Zipf-popular tenants."""
        try:
            spec = ChatTraceSpec(tenants=tenants, sessions=sessions, session_rate_per_s=rate,
                                 turns=(min_turns, max_turns), zipf=zipf, seed=seed)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from e
        records = chat_trace(spec)
        write(records, out)
        tokens = sum(r["input_length"] for r in records)
        blocks = working_set_blocks(records, block_size)
        span = (records[-1]["timestamp"] - records[0]["timestamp"]) / 1000 if records else 0
        print(f"wrote {out}: {len(records):,} requests over {span:,.0f} s, {tenants} tenants, "
              f"{sessions:,} sessions, {tokens:,} prompt tokens, {blocks:,} distinct "
              f"{block_size}-token blocks (working set {blocks * block_size:,} tokens)")
