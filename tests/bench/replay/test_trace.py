"""Trace loading and token synthesis: deterministic tokens, cut prompts, and hash chains
that equal the real hashing while keeping the trace's prefix-dependence."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.replay.trace import (
    CHUNK_TOKENS,
    TokenSynth,
    TraceRequest,
    chunk_tokens,
    load_trace,
    parse_line,
)
from kvmesh.hashing import block_hashes


def req(ids: tuple[int, ...], length: int | None = None, salt: str | None = None,
        lora: tuple[str, str] | None = None) -> TraceRequest:
    return TraceRequest(0, 0.0, length or len(ids) * CHUNK_TOKENS, 1, ids, salt, lora)


def test_same_hash_id_same_tokens_anywhere() -> None:
    a = chunk_tokens((7, 3), 2 * CHUNK_TOKENS).tolist()
    b = chunk_tokens((9, 3), 2 * CHUNK_TOKENS).tolist()
    assert a[CHUNK_TOKENS:] == b[CHUNK_TOKENS:] == chunk_tokens((3,), CHUNK_TOKENS).tolist()
    assert a[:CHUNK_TOKENS] != b[:CHUNK_TOKENS]
    assert all(0 <= t < 32_000 for t in a)


def test_prompt_cut_to_input_length() -> None:
    synth = TokenSynth(16)
    r = req((1, 2, 3), length=2 * CHUNK_TOKENS + 100)
    tokens = synth.tokens(r)
    assert len(tokens) == 2 * CHUNK_TOKENS + 100
    assert tokens == chunk_tokens((1, 2, 3), 3 * CHUNK_TOKENS).tolist()[:len(tokens)]
    assert len(synth.chain(r)) == len(tokens) // 16
    assert len(synth.text(r)) == len(tokens)


@pytest.mark.parametrize("block_size", [16, 48, 512, 1000])
def test_chain_equals_real_hashing_and_is_memoized(block_size: int) -> None:
    synth = TokenSynth(block_size)
    reqs = [req((0, 1, 2), 3 * CHUNK_TOKENS - 37), req((0, 1, 2, 3, 4)),
            req((0, 1, 5), 2 * CHUNK_TOKENS + 1), req((0, 1, 2, 3, 4), salt="s"),
            req((0, 6), lora=("ad", "/ad"))]
    for r in reqs:
        expect = block_hashes(synth.tokens(r), block_size, salt=r.salt, lora=r.lora)
        assert synth.chain(r) == expect
    hashed = synth.hashed_blocks
    for r in reqs:
        assert synth.chain(r) == block_hashes(synth.tokens(r), block_size, salt=r.salt,
                                              lora=r.lora)
    assert synth.hashed_blocks == hashed  # second pass: all from the memo


def test_equal_hash_id_prefixes_give_equal_block_hashes() -> None:
    synth = TokenSynth(16)
    a, b = synth.chain(req((0, 1, 2))), synth.chain(req((0, 1, 9, 10)))
    per_chunk = CHUNK_TOKENS // 16
    assert a[:2 * per_chunk] == b[:2 * per_chunk]
    assert a[2 * per_chunk] != b[2 * per_chunk]
    salted = synth.chain(req((0, 1, 2), salt="tenant"))
    assert not set(salted) & set(a)  # a salt changes block 0, hence the whole chain


def test_load_trace_and_optional_fields(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(o) for o in [
        {"timestamp": 1500, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 500, "input_length": 10, "output_length": 0, "hash_ids": [0],
         "salt": "x", "lora": "sql"},
        {"timestamp": 2000, "input_length": 10, "output_length": 1, "hash_ids": [0],
         "lora": ["sql", "/a/sql"]},
    ]) + "\n\n")
    reqs = load_trace(path)
    assert [r.arrival_s for r in reqs] == [0.5, 1.5, 2.0]
    assert reqs[0].salt == "x" and reqs[0].lora == ("sql", "sql")
    assert reqs[2].lora == ("sql", "/a/sql")
    assert len(load_trace(path, limit=1)) == 1


@pytest.mark.parametrize("line", [
    '{"timestamp": 0, "input_length": 10}',
    '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0]}',
    '{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": [0]}',
    "not json",
])
def test_bad_lines_are_refused(line: str) -> None:
    with pytest.raises(ValueError, match="line 4"):
        parse_line(3, line)
