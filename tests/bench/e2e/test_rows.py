"""``kvmesh bench e2e``'s rows: variants, ``kvmesh@REV``, route-log directories, ratios."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from bench import e2e
from bench.e2e.rows import Setup, preflight, revision_setups, setups
from bench.variants import Variant, parse_list
from bench.workload import WorkloadSpec, chats
from kvmesh.contract import POLICIES


def test_each_variant_is_a_row_with_its_weights_and_log_directory(tmp_path: Path) -> None:
    variants = parse_list("kvmesh,kvmesh[saturation_weight=0],prefix_only", POLICIES)
    rows = setups(variants, route_log=str(tmp_path))
    assert [s.label for s in rows] == ["kvmesh", "kvmesh[saturation_weight=0]", "prefix_only"]
    assert rows[1].variant == Variant("kvmesh", {"saturation_weight": 0.0})
    assert rows[1].route_log_dir == str(tmp_path / "kvmesh[saturation_weight=0]")
    assert all(s.code_dir is None and s.cpu_blocks == 0 for s in rows)
    cpu = setups(variants[:1], cpu_blocks=64)
    assert [(s.label, s.cpu_blocks, s.route_log_dir) for s in cpu] == [
        ("kvmesh", 0, None), ("kvmesh+cpu", 64, None)]


def test_the_revision_rows_run_its_tree_and_log_only_if_it_can(tmp_path: Path) -> None:
    tree = tmp_path / "src"
    (row,) = revision_setups("8cfb7d8", tree, frozenset({"--policy"}), 0, str(tmp_path))
    assert row == Setup("kvmesh@8cfb7d8", Variant("kvmesh"), 0, str(tree), None)
    rows = revision_setups("abc", tree, frozenset({"--route-log"}), 32, str(tmp_path))
    assert [(s.label, s.route_log_dir) for s in rows] == [
        ("kvmesh@abc", str(tmp_path / "kvmesh@abc")),
        ("kvmesh@abc+cpu", str(tmp_path / "kvmesh@abc+cpu"))]
    assert all(not s.variant.overrides for s in rows)  # an old service may lack the flag


def test_preflight_refuses_an_unknown_revision_and_a_used_log_directory(
        tmp_path: Path) -> None:
    kvmesh = [Variant("kvmesh")]
    with pytest.raises(ValueError, match="not a commit"):
        preflight(kvmesh, against="no-such-revision-here")
    preflight(kvmesh, route_log=str(tmp_path))  # empty: fine
    (tmp_path / "kvmesh").mkdir()
    (tmp_path / "kvmesh" / "service-0.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match="holds route logs"):
        preflight(kvmesh, route_log=str(tmp_path))


def _row(name: str, tps: float, ttft: float, hit: float) -> dict:
    return {"policy": name, "tokens_per_s": tps, "mean_ttft_s": ttft, "p90_ttft_s": 2 * ttft,
            "token_hit_rate": hit}


def test_kvmesh_is_compared_with_every_other_row() -> None:
    rows = [_row("kvmesh", 100, 0.1, 0.9), _row("kvmesh[saturation_weight=0]", 50, 0.2, 0.6),
            _row("prefix_only", 200, 0.4, 0.9), _row("round_robin", 50, 1.0, 0.0),
            _row("kvmesh@8cfb7d8", 80, 0.1, 0.9)]
    over = e2e._ratios_over(rows)
    assert list(over) == ["kvmesh[saturation_weight=0]", "prefix_only", "round_robin",
                          "kvmesh@8cfb7d8"]
    assert over["prefix_only"]["throughput"] == 0.5
    assert over["prefix_only"]["mean_ttft_lower"] == pytest.approx(4.0)
    assert math.isinf(over["round_robin"]["token_hit_rate"])
    assert e2e._ratios(rows) == over["round_robin"]  # the goals' ratio is unchanged
    assert e2e._ratios_over(rows[1:]) == {}  # no plain kvmesh row
    cpu = [_row("kvmesh", 1, 1, 1), _row("kvmesh+cpu", 2, 1, 1), _row("prefix_only", 1, 1, 1),
           _row("prefix_only+cpu", 1, 1, 1)]
    assert list(e2e._ratios_over(cpu, cpu=True)) == ["prefix_only+cpu"]


def test_the_command_refuses_a_bad_policy_list_before_running_anything() -> None:
    import typer

    app = typer.Typer()
    e2e.register(app)
    app.command("other")(lambda: None)
    res = CliRunner().invoke(app, ["e2e", "--policies", "kvmesh,kvmesh[bogus=1]"],
                             env={"COLUMNS": "300"})
    assert res.exit_code == 2 and "expected weight=value" in res.output
    res = CliRunner().invoke(app, ["e2e", "--against", "no-such-revision-here"],
                             env={"COLUMNS": "300"})
    assert res.exit_code == 2 and "not a commit" in res.output
    res = CliRunner().invoke(app, ["e2e", "--hot-share", "1.5"], env={"COLUMNS": "300"})
    assert res.exit_code == 2


def test_the_table_names_variant_rows_as_they_are() -> None:
    from rich.console import Console

    from bench.e2e.report import table

    def row(name: str) -> dict:
        return {**_row(name, 100, 0.1, 0.5), "output_tokens_per_s": 1.0,
                "requests_per_s": 1.0, "makespan_s": 1.0, "errors": 0,
                "per_worker": {"a": 1}, "hit_rate_by_tier": {}}

    rows = [row("kvmesh"), row("kvmesh[saturation_weight=0]")]
    res = {"spec": {"workers": 2, "num_blocks": 8, "cpu_blocks": 0,
                    "workload": {"requests": 2, "rate_per_s": 1.0, "tenants": 2,
                                 "system_tokens": 8, "question_tokens": 2, "max_tokens": 1,
                                 "hot_share": 0.5}},
           "rows": rows, "ratios": {}, "ratios_over": e2e._ratios_over(rows)}
    console = Console(width=250, record=True)
    console.print(table(res))
    text = console.export_text()
    assert "kvmesh[saturation_weight=0]" in text and "tenant-0 takes 50%" in text
    assert "kvmesh / kvmesh[saturation_weight=0]" in text


def test_the_command_hands_its_flags_to_the_run(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    import typer

    seen: dict = {}

    def fake_run(spec, variants, progress, against=None, route_log=None, rounds=1,
                 **_: object) -> dict:
        seen.update(spec=spec, variants=variants, against=against, route_log=route_log,
                    rounds=rounds)
        return {"spec": {}, "rows": []}

    monkeypatch.setattr(e2e, "run", fake_run)
    app = typer.Typer()
    e2e.register(app)
    app.command("other")(lambda: None)
    res = CliRunner().invoke(app, [
        "e2e", "--hot-share", "0.5", "--policies", "kvmesh,kvmesh[saturation_weight=0]",
        "--against", "HEAD", "--route-log", str(tmp_path), "--rounds", "3", "--json"])
    assert res.exit_code == 0, res.output
    assert seen["spec"].workload.hot_share == 0.5
    assert [v.label for v in seen["variants"]] == ["kvmesh", "kvmesh[saturation_weight=0]"]
    assert (seen["against"], seen["route_log"]) == ("HEAD", str(tmp_path))
    assert seen["rounds"] == 3


def test_peer_fetch_runs_plain_kvmesh_with_and_without_fetch() -> None:
    variants = parse_list("kvmesh,kvmesh[saturation_weight=0],round_robin", POLICIES)
    rows = setups(variants, peer_fetch=True)
    assert [(s.label, s.peer_fetch) for s in rows] == [
        ("kvmesh+fetch", True), ("kvmesh", False), ("kvmesh[saturation_weight=0]", None),
        ("round_robin", None)]
    assert rows[0].variant == rows[1].variant == Variant("kvmesh")
    assert all(s.peer_fetch is None for s in setups(variants))  # off: rows as before


def test_a_fetch_row_starts_its_cluster_with_the_service_switch(monkeypatch) -> None:
    """run_setup hands the row's switch to the cluster (``kvmesh up --peer-fetch``), runs the
    stream through it and keeps each request's output by its index."""
    import deploy.local

    started: list = []

    class FakeCluster:
        service_addresses = ["svc:1"]
        worker_addresses = ["w:1"]

        def __init__(self, spec) -> None:
            started.append(spec)

        def start(self) -> None:
            pass

        def stop(self) -> None:
            pass

    async def fake_drive(addresses, reqs, policy, tick):
        return [e2e.Outcome(len(r.tokens), 16, 2, 0.1, 0.1, 1.0, "w", "", i, (i, 7),
                            16 if i else 0) for i, r in enumerate(reqs)], 1.0

    async def no_tiers(addresses):
        return {}

    monkeypatch.setattr(deploy.local, "LocalCluster", FakeCluster)
    monkeypatch.setattr(e2e, "drive", fake_drive)
    monkeypatch.setattr(e2e, "tier_hits", no_tiers)
    reqs = chats(WorkloadSpec(tenants=1, system_tokens=32, question_tokens=4,
                              answer_tokens=4, chats_per_tenant=2, turns_per_chat=2))
    fetch, plain = setups([Variant("kvmesh")], peer_fetch=True)
    row = e2e.run_setup(e2e.E2ESpec(workers=2), fetch, reqs, model="m")
    e2e.run_setup(e2e.E2ESpec(workers=2), plain, reqs, model="m")
    assert [(s.peer_fetch, s.model, s.workers) for s in started] == [(True, "m", 2),
                                                                     (False, "m", 2)]
    assert row["outputs"] == {i: [i, 7] for i in range(4)}
    assert row["peer_hit_rate"] == pytest.approx(3 * 16 / sum(len(r.tokens) for r in reqs))


def test_the_command_takes_the_chats_workload_fetch_and_model(monkeypatch) -> None:
    seen: dict = {}

    def fake_run(spec, variants, progress, **kw) -> dict:
        seen.update(spec=spec, **kw)
        return {"spec": {}, "rows": []}

    monkeypatch.setattr(e2e, "run", fake_run)
    app = typer.Typer()
    e2e.register(app)
    app.command("other")(lambda: None)
    res = CliRunner().invoke(app, ["e2e", "--workload", "chats", "--chats-per-tenant", "5",
                                   "--turns", "7", "--answer-tokens", "9", "--peer-fetch",
                                   "--model", "8-layer", "--json"])
    assert res.exit_code == 0, res.output
    w = seen["spec"].workload
    assert (seen["spec"].kind, w.chats_per_tenant, w.turns_per_chat, w.answer_tokens) == (
        "chats", 5, 7, 9)
    assert seen["peer_fetch"] is True and seen["model"] == "8-layer"
    bad = CliRunner().invoke(app, ["e2e", "--workload", "poems"])
    assert bad.exit_code != 0 and "stream, chats" in bad.output
