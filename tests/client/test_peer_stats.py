"""`kvmesh stats`' peer transfer figures: zeros for a worker that reports none, nothing for
a worker whose stats could not be read."""
from __future__ import annotations

from client.peer_stats import FIELDS, in_out, peer_counts, peer_table, plan_cell


def test_counts_default_to_zero_and_unread_stats_to_none() -> None:
    assert peer_counts(None) is None and in_out(None) == "-"
    assert peer_counts({"cache": {}}) == dict.fromkeys(FIELDS, 0)
    assert in_out({"peer": {"fetches": 1200, "served": 7}}) == "1,200/7"


def test_fallbacks_come_with_their_reasons() -> None:
    counts = peer_counts({"peer": {"fallbacks": "3",
                                   "fallbacks_by_reason": {"timeout": "1", "evicted": "2"}}})
    assert counts["fallbacks"] == 3
    assert (counts["fallback:evicted"], counts["fallback:timeout"]) == (2, 1)


def test_the_table_lists_only_workers_with_stats() -> None:
    workers = [{"worker_id": "a", "worker_stats": {"peer": {"served_bytes": 3 << 20,
                                                            "refused": 2}}},
               {"worker_id": "b", "worker_stats": None}]
    table = peer_table(workers)
    assert table is not None and table.row_count == 1
    cells = [list(c.cells)[0] for c in table.columns]
    assert cells[0] == "a" and cells[-2:] == ["3.0 MiB", "2"]
    assert peer_table([{"worker_id": "b", "worker_stats": None}]) is None


def test_a_plan_reads_as_blocks_tokens_source_and_time() -> None:
    from client.results import FetchPlan

    plan = FetchPlan("h", "h:1", 2, (b"a" * 32,) * 3, 48, 0.00125, b"t")
    assert plan_cell(plan) == "3 blk (48 tok) from h, ~1.2 ms" and plan_cell(None) == "-"
