"""``service/metrics.py``: the merged batches of a cluster backend's group commit are read
at each scrape, on the metrics page and in Stats' counters."""
from __future__ import annotations

from prometheus_client import generate_latest

from service.metrics import ServiceMetrics


class Writes:
    merged = 0


def test_merged_batches_are_read_at_each_scrape() -> None:
    m, writes = ServiceMetrics(), Writes()
    m.count_merges(writes)
    assert m.summary()["index_merged_batches_total"] == 0
    writes.merged = 7
    assert m.summary()["index_merged_batches_total"] == 7
    assert b"kvmesh_index_merged_batches_total 7.0" in generate_latest(m.registry)


def test_a_backend_without_group_commit_exports_none() -> None:
    assert "index_merged_batches_total" not in ServiceMetrics().summary()
