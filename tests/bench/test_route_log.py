"""``bench.route_log``: leaving the holder, why, and the load's age, on a synthetic log."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import route_log

ZERO = {"prefill": 0.0, "saturation": 0.0, "queue": 0.0, "decode": 0.0, "running": 0.0,
        "wait": 0.0}


def cand(worker: str, blocks: int, age: int, terms: dict[str, float] | None = None,
         cost: float | None = None) -> dict:
    c = {"worker": worker, "matched": {"gpu": blocks, "cpu": 0, "disk": 0},
         "load_age_ms": age, "pending": {"requests": 0, "tokens": 0}, "load": {}}
    if terms is not None:
        c["terms"] = {**ZERO, **terms}
        c["cost"] = sum(c["terms"].values())
    else:
        c["cost"] = cost if cost is not None else 0.0
    return c


def rec(t: int, *cands: dict, policy: str = "kvmesh") -> dict:
    return {"t_ms": t, "policy": policy, "degraded": False, "prompt_tokens": 1600,
            "candidates": list(cands)}


def synthetic() -> list[dict]:
    return [
        # kept the holder (it holds the most): not a leave
        rec(1, cand("a", 96, 10, {"prefill": 10}), cand("b", 0, 20, {"prefill": 3000})),
        # left for the holder's queue (queue excess 4000 > decode excess 500)
        rec(2, cand("b", 0, 300, {"prefill": 3000}),
            cand("a", 96, 50, {"prefill": 10, "queue": 4000, "decode": 500})),
        # left for its decode load (decode + running: 2000 + 1500 > queue 1000)
        rec(3, cand("c", 10, 40, {"prefill": 2000}),
            cand("a", 96, 5, {"prefill": 10, "queue": 1000, "decode": 2000, "running": 1500})),
        # left for the wait for room
        rec(4, cand("b", 0, 150, {"prefill": 3000}),
            cand("a", 96, 5, {"prefill": 10, "wait": 3200})),
        # a tie: equal costs, the coin chose
        rec(5, cand("b", 0, 20, {"prefill": 3000}),
            cand("a", 96, 5, {"prefill": 10, "queue": 2990})),
        # the holder's load terms are no higher: other (e.g. a pool too small, ranked last)
        rec(6, cand("b", 0, 120, {"prefill": 3000}), cand("a", 96, 5, {"prefill": 10})),
        # a baseline leaves with no terms to say why
        rec(7, cand("b", 0, 1000, cost=0.0), cand("a", 96, 900, cost=1.0),
            policy="round_robin"),
    ]


def test_leaves_are_counted_and_each_gets_its_reason() -> None:
    s = route_log.summarize(synthetic())
    assert s["routes"] == 7 and s["left_holder"] == 6
    assert s["left_holder_share"] == pytest.approx(6 / 7)
    assert s["why"] == {"queue": 1, "load": 1, "wait": 1, "tie": 1, "other": 1,
                        "no terms": 1}
    assert s["blocks_given_up_mean"] == pytest.approx((96 * 5 + 86) / 6)
    # the chosen loads older than 100 ms: decisions 2, 4, 6 and 7
    assert s["stale_left"] == 4 and s["stale_left_share"] == pytest.approx(4 / 6)
    assert s["chosen_load_age_ms"] == {"p50": 120, "p90": 1000}
    every = sorted([10, 20, 300, 50, 40, 5, 150, 5, 20, 5, 120, 5, 1000, 900])
    assert s["load_age_ms"] == {"p50": every[6], "p90": every[12]}


def test_the_biggest_excess_names_the_reason() -> None:
    holder = cand("a", 9, 0, {"prefill": 0, "queue": 100, "wait": 150})
    assert route_log.reason(holder, cand("b", 0, 0, {"prefill": 200})) == "wait"
    holder = cand("a", 9, 0, {"prefill": 0, "queue": 200, "wait": 150})
    assert route_log.reason(holder, cand("b", 0, 0, {"prefill": 200, "queue": 60})) == "wait"


def test_read_merges_the_replicas_in_time_order_and_describe_says_it(tmp_path: Path) -> None:
    recs = synthetic()
    (tmp_path / "service-0.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in recs[::2]))
    (tmp_path / "service-1.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in recs[1::2]))
    (tmp_path / "notes.txt").write_text("not a log")
    got = route_log.read(tmp_path)
    assert [r["t_ms"] for r in got] == [1, 2, 3, 4, 5, 6, 7]
    text = route_log.describe("kvmesh", route_log.summarize(got))
    assert "left the holder in 6 (85.7%)" in text and "queue 17%" in text
    assert route_log.describe("x", route_log.summarize([])) == "x: no routes logged"
