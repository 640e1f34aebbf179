"""Fixtures of the bench tests: a tiny Mooncake-format trace with known structure (replay).

``convs`` conversations of ``turns`` turns each. Every prompt starts with the shared chunk 0
(a system prompt); turn t of a conversation is turn t-1's chunks plus one or two new ones,
so equal hash ids always follow equal prefixes, as in the real traces. Turns of different
conversations interleave, one arrival every ``gap_s`` (13 conversations, so that round robin
does not send every turn of a conversation to the same worker by accident).
"""
from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.replay.trace import CHUNK_TOKENS


def write_trace(path: Path, convs: int = 13, turns: int = 4, gap_s: float = 0.05,
                seed: int = 0, salts: bool = False) -> Path:
    rng = random.Random(seed)
    next_id = 1
    prompts: list[list[int]] = [[0] for _ in range(convs)]
    order = [(t, c) for t in range(turns) for c in range(convs)]
    lines = []
    for i, (_, c) in enumerate(order):
        grow = rng.randint(1, 2)
        prompts[c] = prompts[c] + list(range(next_id, next_id + grow))
        next_id += grow
        ids = prompts[c]
        rec = {"timestamp": int(i * gap_s * 1000),
               "input_length": len(ids) * CHUNK_TOKENS - rng.randrange(200),
               "output_length": rng.randint(4, 40), "hash_ids": ids}
        if salts:
            rec["salt"] = f"tenant-{c % 2}"
        lines.append(json.dumps(rec))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def small_trace(tmp_path: Path) -> Path:
    """The default small trace: 13 conversations x 4 turns, 52 requests."""
    return write_trace(tmp_path / "small.jsonl")


@pytest.fixture
def make_trace() -> Callable[..., Path]:
    """:func:`write_trace`, for tests that need another shape."""
    return write_trace
