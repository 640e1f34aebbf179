"""Rows of a replay beyond the plain policies: variants ``kvmesh[weight=value,...]`` and
``kvmesh@REV`` (``--against REV``: the policy of a git revision in the live simulator)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench.replay.replay import PolicyResult, ReplayConfig, make_router, run
from bench.replay.report import targets
from bench.replay.revision_policy import PolicyAtRevision, load, resolve
from bench.replay.rows import parse_row
from bench.replay.trace import TokenSynth, TraceRequest, load_trace
from service.config import CostWeights
from tests.bench.replay.test_replay import cli

CFG = ReplayConfig(workers=4, block_size=16, capacity_blocks=2000)
# The last commit before the routing branch: service/policy.py, one module, whose kvmesh
# policy ranks a worker without free blocks for the request's new blocks after all others.
GUARD_REV = "8cfb7d8"


def revision_or_skip(rev: str) -> str:
    try:
        return resolve(rev)
    except ValueError:
        pytest.skip(f"{rev} is not in this clone's history")


def same_figures(a: PolicyResult, b: PolicyResult) -> bool:
    return (a.hit_tokens, a.per_worker_prefill, a.ttfts, a.evictions, a.busy_s) == (
        b.hit_tokens, b.per_worker_prefill, b.ttfts, b.evictions, b.busy_s)


def test_a_variant_row_runs_kvmesh_with_its_weights_under_its_label(small_trace: Path) -> None:
    label = "kvmesh[prefill_weight=0,saturation_weight=0,wait_weight=0]"
    router = make_router(label, CFG, TokenSynth(16), lambda: None)  # type: ignore[arg-type]
    assert router.policy.w == CostWeights(prefill_weight=0, saturation_weight=0,
                                          wait_weight=0)
    assert router.name == label and router.ns != make_router(
        "kvmesh", CFG, TokenSynth(16), lambda: None).ns  # type: ignore[arg-type]
    reqs = load_trace(small_trace)
    plain, variant = run(reqs, ["kvmesh", label], CFG)
    assert (plain.policy, variant.policy) == ("kvmesh", label)
    # prefill weighed 0: the match no longer matters, so the variant routes otherwise
    assert variant.hit_tokens < plain.hit_tokens


def test_a_variant_is_no_target_nor_rival(small_trace: Path) -> None:
    reqs = load_trace(small_trace)[:30]
    res = run(reqs, ["kvmesh", "kvmesh[saturation_weight=0]", "round_robin"], CFG)
    res[1].ttfts = [0.0] * len(res[1].ttfts)  # the variant's p90 beats everything
    names = dict((name, detail) for name, _, detail in targets(res))
    assert "best other round_robin" in names["lowest p90 TTFT"]


def test_a_bad_row_is_refused_before_anything_runs() -> None:
    for label, error in [("kvmesh[bogus=1]", "expected weight=value"),
                         ("prefix_only@HEAD", "only kvmesh"), ("kvmesh@", "git revision"),
                         ("kvmesh@no-such-rev", "names no commit")]:
        with pytest.raises(ValueError, match=error):
            run([], [label], CFG)


def test_against_head_is_the_current_row_exactly(small_trace: Path) -> None:
    revision_or_skip("HEAD")
    reqs = load_trace(small_trace)
    now, head = run(reqs, ["kvmesh", "kvmesh@HEAD"], CFG)
    assert head.policy == "kvmesh@HEAD"
    assert same_figures(now, head)
    assert head.summary() | {"policy": "", "wall_s": 0} == now.summary() | {"policy": "",
                                                                            "wall_s": 0}


def test_a_revision_loads_privately_with_its_own_weights() -> None:
    sha = revision_or_skip(GUARD_REV)
    module = load(GUARD_REV)
    assert module.__name__ == f"_kvmesh_at_{sha[:12]}.policy"
    assert sys.modules["service.policy"].__name__ == "service.policy"  # the live one
    policy = PolicyAtRevision(GUARD_REV)
    assert policy.inner.w.free_block_guard is True  # REV's CostWeights, REV's defaults
    assert not hasattr(CostWeights(), "free_block_guard")
    assert PolicyAtRevision(GUARD_REV, {"prefill_weight": 1.0}).inner.w.prefill_weight == 1.0
    with pytest.raises(ValueError, match="CostWeights"):
        PolicyAtRevision(GUARD_REV, {"wait_weight": 0.0})  # REV has no such weight
    assert parse_row("kvmesh[prefill_weight=1]@8cfb7d8").label == (
        "kvmesh[prefill_weight=1]@8cfb7d8")


def guard_trace() -> list[TraceRequest]:
    """Two workers of 200 blocks. A (128 blocks of prompt) decodes 1,000 tokens on one of them
    and leaves it 9 free blocks; B extends A's prompt by one chunk (32 new blocks) while A
    still decodes."""
    return [TraceRequest(0, 0.0, 2048, 1000, (1, 2, 3, 4)),
            TraceRequest(1, 1.0, 2560, 1, (1, 2, 3, 4, 5))]


def test_against_an_older_revision_shows_where_the_code_differs() -> None:
    revision_or_skip(GUARD_REV)
    cfg = ReplayConfig(workers=2, block_size=16, capacity_blocks=200)
    now, old, head = run(guard_trace(), ["kvmesh", f"kvmesh@{GUARD_REV}", "kvmesh@HEAD"], cfg)
    # now: A's holder costs B a wait for room (23 blocks' worth), far less than recomputing
    # its 2,048 cached tokens elsewhere: B waits for A and hits
    assert now.hit_tokens == 2048 and sorted(now.per_worker_prefill) == [0, 2048 + 512]
    # then: the guard ranks the holder, 9 free blocks for 32 new ones, after the idle worker
    assert old.hit_tokens == 0 and sorted(old.per_worker_prefill) == [2048, 2560]
    assert old.ttft_s(100) < now.ttft_s(100)  # B did not wait for A's decode
    assert same_figures(now, head)


@pytest.mark.slow
def test_cli_variants_and_against_rows(small_trace: Path) -> None:
    revision_or_skip("HEAD")
    out = CliRunner().invoke(cli(), [
        "bench", "replay", str(small_trace), "--workers", "4", "--capacity-blocks", "2000",
        "--limit", "20", "--json", "--policy", "round_robin,kvmesh,kvmesh[saturation_weight=0]",
        "--against", "HEAD"])
    assert out.exit_code == 0, out.output
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    assert [x["policy"] for x in lines] == ["round_robin", "kvmesh", "kvmesh@HEAD",
                                            "kvmesh[saturation_weight=0]"]
    assert {k: v for k, v in lines[1].items() if k not in ("policy", "wall_s")} == {
        k: v for k, v in lines[2].items() if k not in ("policy", "wall_s")}
    table = CliRunner().invoke(cli(), [
        "bench", "replay", str(small_trace), "--workers", "4", "--limit", "10",
        "--policy", "kvmesh[saturation_weight=0]", "--against", "HEAD"])
    assert table.exit_code == 0, table.output
    # the label is text, not rich markup, and is folded, not cut, where the table is narrow
    cells = "".join(line.split("│")[1].strip() for line in table.stdout.splitlines()
                    if line.startswith("│"))
    assert "kvmesh[saturation_weight=0]kvmesh@HEAD" in cells


@pytest.mark.parametrize("args, error", [
    (["--against", "no-such-rev"], "names no commit"), (["--policy", "kvmesh[bogus=1]"], "bogus")])
def test_cli_refuses_a_bad_row(small_trace: Path, args: list[str], error: str) -> None:
    out = CliRunner().invoke(cli(), ["bench", "replay", str(small_trace), *args])
    assert out.exit_code != 0 and error in out.output
