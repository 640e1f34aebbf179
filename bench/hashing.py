"""`kvmesh bench hashing`: the block-hash chain against the plain way, side by side.

The plain way is what vLLM does per block: serialize the whole ``(parent, tokens, extra)``
tuple (cbor2 canonical or pickle), then digest. kvmesh must be byte-identical and at least as
fast; the ratio (plain time / kvmesh time) is what we report, since absolute times on shared
machines are noise.
"""
from __future__ import annotations

import json
import random
from functools import partial

import typer

from bench.timing import median_s


def _plain_chain(tokens: list[int], block_size: int, algo: str) -> list[bytes]:
    from kvmesh.hashing import hash_value, none_hash

    parent, out = none_hash(algo), []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash_value(algo, (parent, tuple(tokens[start:start + block_size]), None))
        out.append(parent)
    return out


def run(num_tokens: int = 4096, block_size: int = 16, vocab: int = 128_256,
        repeats: int = 30, seed: int = 0) -> list[dict]:
    from kvmesh.contract import ALGOS
    from kvmesh.hashing import block_hashes

    rng = random.Random(seed)
    tokens = [rng.randrange(vocab) for _ in range(num_tokens)]
    rows = []
    for algo in ALGOS:
        assert block_hashes(tokens, block_size, algo=algo) == _plain_chain(tokens, block_size, algo)
        plain = fast = 0.0
        for _ in range(3):  # alternate rounds so both sides see the same machine load
            plain += median_s(partial(_plain_chain, tokens, block_size, algo), repeats)
            fast += median_s(partial(block_hashes, tokens, block_size, algo=algo), repeats)
        blocks = num_tokens // block_size
        rows.append({"algo": algo, "blocks": blocks,
                     "plain_us_per_block": plain / 3 / blocks * 1e6,
                     "kvmesh_us_per_block": fast / 3 / blocks * 1e6,
                     "speedup": plain / fast})
    return rows


def register(bench: typer.Typer) -> None:
    @bench.command("hashing")
    def hashing(num_tokens: int = typer.Option(4096, help="prompt length in tokens"),
                block_size: int = typer.Option(16),
                vocab: int = typer.Option(128_256, help="token ids drawn from [0, vocab)"),
                repeats: int = typer.Option(30),
                as_json: bool = typer.Option(False, "--json")) -> None:
        """Block-hash chain: kvmesh's encoder vs serialize-then-digest per block."""
        rows = run(num_tokens, block_size, vocab, repeats)
        if as_json:
            for row in rows:
                print(json.dumps(row))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"block-hash chain, {num_tokens} tokens, block size {block_size}, "
                            f"vocab {vocab}")
        for col in ("algo", "plain µs/block", "kvmesh µs/block", "speedup (plain/kvmesh)"):
            table.add_column(col, justify="right")
        for r in rows:
            table.add_row(r["algo"], f"{r['plain_us_per_block']:.2f}",
                          f"{r['kvmesh_us_per_block']:.2f}", f"{r['speedup']:.2f}x")
        Console().print(table)
