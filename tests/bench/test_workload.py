"""``bench.workload.stream`` with a hot tenant (``hot_share``), and without one unchanged;
``bench.workload.chats``: chats growing turn after turn on their tenant's system prompt."""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from bench.workload import Request, WorkloadSpec, chats, stream

SPEC = WorkloadSpec(tenants=5, system_tokens=32, question_tokens=8, max_tokens=3,
                    rate_per_s=10.0, requests=400, seed=7)


def _uniform_stream_as_it_was(spec: WorkloadSpec) -> list[Request]:
    """``stream`` as written before ``hot_share`` existed (commit 8cfb7d8), kept here so the
    default stream can be checked draw for draw against it."""
    rng = random.Random(spec.seed)
    systems = [[rng.randrange(256) for _ in range(spec.system_tokens)]
               for _ in range(spec.tenants)]
    out, clock = [], 0.0
    for _ in range(spec.requests):
        t = rng.randrange(spec.tenants)
        question = [rng.randrange(256) for _ in range(spec.question_tokens)]
        out.append(Request(clock, f"tenant-{t}", systems[t] + question, spec.max_tokens))
        clock += rng.expovariate(spec.rate_per_s)
    return out


def test_no_hot_share_gives_exactly_the_requests_of_before() -> None:
    assert stream(SPEC) == _uniform_stream_as_it_was(SPEC)
    e2e_default = WorkloadSpec(tenants=8, system_tokens=1536, question_tokens=64,
                               max_tokens=8, rate_per_s=12.0, requests=240)
    assert stream(e2e_default) == _uniform_stream_as_it_was(e2e_default)


def test_the_hot_tenant_gets_its_share_and_the_others_share_the_rest() -> None:
    reqs = stream(replace(SPEC, hot_share=0.5, requests=4000))
    counts = Counter(r.salt for r in reqs)
    assert set(counts) == {f"tenant-{i}" for i in range(5)}
    assert counts["tenant-0"] / 4000 == pytest.approx(0.5, abs=0.03)
    for i in range(1, 5):  # the other half, uniform over four tenants
        assert counts[f"tenant-{i}"] / 4000 == pytest.approx(0.125, abs=0.02)
    systems = {r.salt: r.tokens[:32] for r in reqs}
    assert systems == {r.salt: r.tokens[:32] for r in reversed(reqs)}  # one prompt each
    assert [r.arrival_s for r in reqs] == sorted(r.arrival_s for r in reqs)


def test_extreme_shares() -> None:
    assert {r.salt for r in stream(replace(SPEC, hot_share=1.0))} == {"tenant-0"}
    one = stream(replace(SPEC, tenants=1, hot_share=0.3, requests=20))
    assert {r.salt for r in one} == {"tenant-0"}
    with pytest.raises(ValueError, match="hot_share must be in"):
        WorkloadSpec(hot_share=1.5)


CHATS = WorkloadSpec(tenants=2, system_tokens=48, question_tokens=8, answer_tokens=6,
                     chats_per_tenant=3, turns_per_chat=4, max_tokens=2, rate_per_s=5.0,
                     requests=0, seed=3)


def test_chats_grow_turn_after_turn_on_their_tenants_system_prompt() -> None:
    reqs = chats(CHATS)
    assert len(reqs) == 2 * 3 * 4 and reqs == chats(CHATS)  # every turn; seeded
    assert [r.arrival_s for r in reqs] == sorted(r.arrival_s for r in reqs)
    assert reqs[0].arrival_s == 0.0 and all(r.max_tokens == 2 for r in reqs)
    per_round = 2 * 3  # every chat's turn k, then every chat's turn k + 1
    rounds = [reqs[k * per_round:(k + 1) * per_round] for k in range(4)]
    for k, batch in enumerate(rounds):
        assert all(len(r.tokens) == 48 + k * (8 + 6) + 8 for r in batch)
    for before, after in zip(rounds, rounds[1:], strict=False):
        # each turn is exactly one turn of the round before (its chat's) extended: that
        # turn's prompt, its answer, then a new question
        for r in after:
            (prev,) = [b for b in before if r.tokens[:len(b.tokens)] == b.tokens]
            assert prev.salt == r.salt
    systems = {(r.salt, tuple(r.tokens[:48])) for r in reqs}
    assert len(systems) == 2 and {s for s, _ in systems} == {"tenant-0", "tenant-1"}
    assert len({tuple(r.tokens) for r in reqs}) == len(reqs)  # no two prompts alike


def test_round_robin_does_not_keep_chats_on_one_worker_by_coincidence() -> None:
    """Each round sends the chats in a new order: with 12 chats and 2 or 3 workers (which
    divide 12), request i % W of every round is not chat i's worker again."""
    spec = replace(CHATS, tenants=1, chats_per_tenant=12, turns_per_chat=6)
    reqs = chats(spec)
    chat_of: dict[tuple[int, ...], int] = {}  # a turn's prompt -> its chat
    for i, r in enumerate(reqs[:12]):
        chat_of[tuple(r.tokens)] = i
    for workers in (2, 3):
        seen: dict[int, set[int]] = {}
        for i, r in enumerate(reqs):
            chat = next(c for p, c in chat_of.items() if tuple(r.tokens[:len(p)]) == p)
            seen.setdefault(chat, set()).add(i % workers)
        sticky = sum(len(w) == 1 for w in seen.values())
        assert sticky <= 2, (workers, sticky)  # lockstep order: all 12 chats sticky


def test_chats_stop_at_the_requests_asked_for() -> None:
    reqs = chats(replace(CHATS, requests=7))
    assert reqs == chats(CHATS)[:7]
    assert chats(replace(CHATS, requests=1000)) == chats(CHATS)
