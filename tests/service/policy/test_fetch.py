"""The peer-fetch option of the kvmesh policy: when a pull beats running on the holder or
recomputing, and when it is never planned."""
from __future__ import annotations

import random

import pytest

from service.index.base import BlockMatch, WorkerLoad
from service.policy.base import WorkerView
from service.policy.cost import KvmeshPolicy
from service.policy.fetch import FetchCosts, holder, plan

BS = 16
PROMPT = 64 * BS + 5


def _view(wid, blocks=0, queued=0, peer=True, ns="m", per_block=100.0, prefill_us=100.0):
    load = WorkerLoad(queued_prefill_tokens=queued, free_blocks=4096, total_blocks=4096,
                      free_empty_blocks=4096, prefill_us_per_token=prefill_us,
                      fetch_us_per_block=per_block, peer_fetch=peer)
    return WorkerView(wid, f"{wid}:1", load, BlockMatch(blocks, blocks), BS, ns)


def _rank(views, **kw):
    policy = KvmeshPolicy(fetch_costs=FetchCosts(enabled=True, **kw))
    return policy.rank(PROMPT, views, random.Random(0))


def test_an_idle_holder_runs_it_itself() -> None:
    best = _rank([_view("h", 64), _view("w")])[0]
    assert best.view.worker_id == "h" and best.fetch is None


def test_a_busy_holder_makes_an_idle_worker_pull_its_prefix() -> None:
    best = _rank([_view("h", 64, queued=20_000), _view("w")])[0]
    assert best.view.worker_id == "w"
    assert best.fetch is not None and best.fetch.source.worker_id == "h"
    assert (best.fetch.start_block, best.fetch.blocks) == (0, 64)
    assert best.matched_tokens == 64 * BS


def test_the_pull_starts_after_the_receivers_own_match() -> None:
    best = _rank([_view("h", 64, queued=20_000), _view("w", 10)])[0]
    assert (best.fetch.start_block, best.fetch.blocks) == (10, 54)


def test_a_slow_transfer_loses_to_recompute() -> None:
    # 1 s per block: recomputing 16 tokens at 100 us each is far cheaper
    ranked = _rank([_view("h", 64, queued=20_000), _view("w", per_block=1e6)])
    assert all(r.fetch is None for r in ranked)


@pytest.mark.parametrize("case", ["off", "short", "no_peer_receiver", "no_peer_source",
                                  "other_ns"])
def test_no_fetch_is_planned(case) -> None:
    h = _view("h", 64, queued=20_000, peer=case != "no_peer_source")
    w = _view("w", 60 if case == "short" else 0, peer=case != "no_peer_receiver",
              ns="other" if case == "other_ns" else "m")
    costs = FetchCosts(enabled=case != "off", min_fetch_blocks=8)
    assert plan(w, holder([h, w]), costs) is None


def test_without_fetch_the_ranking_is_unchanged() -> None:
    views = [_view("h", 64, queued=20_000), _view("w"), _view("x", 3)]
    plain = KvmeshPolicy().rank(PROMPT, views, random.Random(1))
    off = KvmeshPolicy(fetch_costs=FetchCosts()).rank(PROMPT, views, random.Random(1))
    assert [(r.view.worker_id, r.cost, r.fetch) for r in plain] == \
        [(r.view.worker_id, r.cost, r.fetch) for r in off]


def test_min_fetch_blocks_must_be_positive() -> None:
    with pytest.raises(ValueError):
        FetchCosts(min_fetch_blocks=0)


def test_each_namespace_fetches_from_its_own_holder() -> None:
    """A longer match in another namespace (other block size or hash) must not hide this
    namespace's holder."""
    other = _view("o", 64, queued=20_000, ns="other")
    h, w = _view("h", 40, queued=20_000), _view("w")
    best = [r for r in _rank([other, h, w]) if r.view.worker_id == "w"][0]
    assert best.fetch is not None and best.fetch.source.worker_id == "h"
