"""The multi-tenant chat trace (``bench.workload.chat_trace``) and ``kvmesh bench trace chat``:
deterministic, Mooncake-valid, prefix-dependent (each turn resends the previous one and its
answer), one salt per tenant, system prompts shared by a tenant's chats."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench.replay.trace import CHUNK_TOKENS, TokenSynth, parse_line
from bench.traces import working_set_blocks
from bench.workload import ChatSession, ChatTraceSpec, chat_sessions, chat_trace
from client.cli import app
from kvmesh.hashing import block_hashes

SMALL = ChatTraceSpec(tenants=4, sessions=12, turns=(3, 6), seed=3)


def requests(session: ChatSession) -> list:
    return [parse_line(k, json.dumps(rec)) for k, rec in enumerate(session.records())]


def test_the_trace_is_deterministic_in_its_spec() -> None:
    assert chat_trace(SMALL) == chat_trace(SMALL)
    assert chat_trace(SMALL) != chat_trace(ChatTraceSpec(tenants=4, sessions=12, turns=(3, 6),
                                                         seed=4))


def test_records_are_mooncake_lines_in_arrival_order() -> None:
    recs = chat_trace(SMALL)
    sessions = chat_sessions(SMALL)
    assert len(recs) == sum(len(s.turns) for s in sessions)
    assert [r["timestamp"] for r in recs] == sorted(r["timestamp"] for r in recs)
    for i, rec in enumerate(recs):
        assert set(rec) == {"timestamp", "input_length", "output_length", "hash_ids", "salt"}
        req = parse_line(i, json.dumps(rec))  # the replay's own checks
        # exactly the chunks the prompt reaches into (the last one cut)
        assert len(req.hash_ids) == -(-req.input_length // CHUNK_TOKENS)


def test_each_turn_resends_the_previous_prompt_and_its_answer() -> None:
    synth = TokenSynth(16)
    for s in chat_sessions(SMALL):
        reqs = requests(s)
        for before, after in zip(reqs, reqs[1:], strict=False):
            assert after.arrival_s > before.arrival_s
            # the history grew by the answer and a new user message (at least a token)
            assert after.input_length > before.input_length + before.output_length
            # a chunk the previous prompt filled in part keeps its id and its tokens
            assert synth.tokens(after)[:before.input_length] == synth.tokens(before)
            assert synth.chain(after)[:len(synth.chain(before))] == synth.chain(before)


def test_ids_are_prefix_dependent_so_the_memoized_chain_is_the_real_one() -> None:
    # TokenSynth hashes each chunk once and reuses it wherever the id recurs: right only if
    # every id follows one prefix. Compare with hashing every prompt from scratch.
    synth = TokenSynth(16)
    for i, rec in enumerate(chat_trace(SMALL)):
        req = parse_line(i, json.dumps(rec))
        assert synth.chain(req) == block_hashes(synth.tokens(req), 16, salt=req.salt)


def test_tenants_have_their_salt_and_share_their_system_prompts() -> None:
    spec = ChatTraceSpec(tenants=3, sessions=40, system_prompts=(1, 2), zipf=0.0, seed=1)
    sessions = chat_sessions(spec)
    prompts: dict[int, set[tuple[int, ...]]] = defaultdict(set)
    uses: dict[tuple[int, ...], int] = defaultdict(int)
    for s in sessions:
        assert {r["salt"] for r in s.records()} == {f"tenant-{s.tenant}"}
        assert all(r["hash_ids"][:len(s.system_ids)] == list(s.system_ids)
                   for r in s.records())
        assert 2 * CHUNK_TOKENS <= len(s.system_ids) * CHUNK_TOKENS <= 6 * CHUNK_TOKENS
        prompts[s.tenant].add(s.system_ids)
        uses[s.system_ids] += 1
    assert all(1 <= len(p) <= 2 for p in prompts.values())
    assert max(uses.values()) > 1  # a system prompt is shared by several chats
    # no id is both a tenant's and another's, nor a system prompt's and a session's own
    owners: dict[int, object] = {}
    for s in sessions:
        for h in s.system_ids:
            assert owners.setdefault(h, ("system", s.tenant)) == ("system", s.tenant)
        for h in s.ids:
            assert owners.setdefault(h, ("session", s.index)) == ("session", s.index)


def test_popular_tenants_start_more_sessions() -> None:
    spec = ChatTraceSpec(tenants=10, sessions=400, turns=(1, 1), zipf=1.0, seed=2)
    count = [0] * spec.tenants
    for s in chat_sessions(spec):
        count[s.tenant] += 1
    assert count[0] > 2 * count[-1] and count[0] > count[4]


def test_working_set_counts_distinct_blocks() -> None:
    recs = chat_trace(SMALL)
    synth = TokenSynth(16)
    distinct = {h for i, rec in enumerate(recs) for h in synth.chain(parse_line(i,
                                                                             json.dumps(rec)))}
    assert working_set_blocks(recs, 16) == len(distinct)
    synth = TokenSynth(48)  # blocks straddling chunks
    distinct = {h for i, rec in enumerate(recs) for h in synth.chain(parse_line(i,
                                                                             json.dumps(rec)))}
    assert working_set_blocks(recs, 48) == len(distinct)


@pytest.mark.parametrize("field, value", [("turns", (0, 3)), ("think_s", (5.0, 1.0)),
                                          ("tenants", 0), ("session_rate_per_s", 0.0)])
def test_a_bad_spec_is_refused(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        ChatTraceSpec(**{field: value})


def test_the_command_writes_the_trace_and_says_what_it_holds(tmp_path: Path) -> None:
    out = tmp_path / "chat.jsonl"
    res = CliRunner().invoke(app, ["bench", "trace", "chat", str(out), "--tenants", "4",
                                   "--sessions", "12", "--min-turns", "3", "--max-turns", "6",
                                   "--seed", "3"])
    assert res.exit_code == 0, res.output
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert recs == chat_trace(SMALL)
    tokens = sum(r["input_length"] for r in recs)
    blocks = working_set_blocks(recs, 16)
    assert f"{len(recs):,} requests" in res.stdout and "4 tenants" in res.stdout
    assert f"12 sessions, {tokens:,} prompt tokens, {blocks:,} distinct" in res.stdout
    bad = CliRunner().invoke(app, ["bench", "trace", "chat", str(out), "--min-turns", "5",
                                   "--max-turns", "2"])
    assert bad.exit_code != 0 and "turns" in bad.output
