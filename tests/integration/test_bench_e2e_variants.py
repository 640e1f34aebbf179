"""``kvmesh bench e2e`` with a variant row, ``--against REV`` and ``--route-log``, on real
local clusters (one short run: three small clusters)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench import e2e, route_log
from bench.e2e.report import show
from bench.revision import repo_root, service_flags, source_tree
from bench.variants import parse_list
from bench.workload import WorkloadSpec
from kvmesh.contract import POLICIES

REV = "8cfb7d8"  # the commit before the route log and --cost-weight existed
VARIANT = "kvmesh[prefill_weight=3,saturation_weight=0]"
SPEC = e2e.E2ESpec(workers=2, num_blocks=64,
                   workload=WorkloadSpec(tenants=2, system_tokens=64, question_tokens=16,
                                         max_tokens=2, rate_per_s=10.0, requests=30, seed=1))


def _have(rev: str) -> bool:
    return subprocess.run(["git", "-C", str(repo_root()), "cat-file", "-e", f"{rev}^{{commit}}"],
                          capture_output=True).returncode == 0


needs_rev = pytest.mark.skipif(not _have(REV), reason=f"{REV} not in this clone's history")


@pytest.mark.integration
@needs_rev
def test_the_revision_tree_is_what_its_children_import() -> None:
    """A child run from the extracted tree imports it, not this (editable) installation:
    its ``kvmesh service`` lacks the flags this tree added."""
    with source_tree(REV) as tree:
        assert "--policy" in service_flags(tree)
        assert not {"--route-log", "--cost-weight"} & service_flags(tree)
        assert list((tree / "kvmesh").glob("_chain*.so"))  # hashes in C, as here
    assert {"--route-log", "--cost-weight"} <= service_flags(repo_root())


@pytest.mark.integration
@needs_rev
def test_a_short_run_with_a_variant_a_revision_and_route_logs(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture
                                                              ) -> None:
    res = e2e.run(SPEC, parse_list(f"kvmesh,{VARIANT}", POLICIES), against=REV,
                  route_log=str(tmp_path))
    labels = [r["policy"] for r in res["rows"]]
    assert labels == ["kvmesh", VARIANT, f"kvmesh@{REV}"]
    for r in res["rows"]:
        assert r["requests"] == 30 and r["errors"] == 0, r
    assert list(res["ratios_over"]) == [VARIANT, f"kvmesh@{REV}"]
    # REV's service has no --route-log: its row runs without one
    assert list(res["route_logs"]) == ["kvmesh", VARIANT]
    for summary in res["route_logs"].values():
        assert summary["routes"] == 30 and summary["load_age_ms"]["p50"] is not None
    # the variant's weights reached its service (and only its): every term says so
    for label, prefill_weight, saturation in (("kvmesh", 2.0, None), (VARIANT, 3.0, 0.0)):
        for rec in route_log.read(tmp_path / label):
            for c in rec["candidates"]:
                uncached = rec["prompt_tokens"] - 16 * c["matched"]["gpu"]
                assert c["terms"]["prefill"] == prefill_weight * uncached
                assert saturation is None or c["terms"]["saturation"] == saturation
    json.dumps(res)
    show(res)
    out = capsys.readouterr().out
    assert f"route log {VARIANT}: 30 routes" in out, out
    assert f"kvmesh@{REV}: the service and workers of git revision" in out, out
