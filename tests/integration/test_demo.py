"""`kvmesh demo` end to end on real clusters, at a small size."""
from __future__ import annotations

from typer.testing import CliRunner

from bench.workload import WorkloadSpec, sessions
from client.cli import app


def test_workload_is_seeded_and_sized():
    spec = WorkloadSpec(requests=40, seed=3)
    a, b = sessions(spec), sessions(spec)
    assert [s.prefix for s in a] == [s.prefix for s in b]
    assert sum(len(s.turns) for s in a) == 40
    assert {s.salt for s in a} <= {f"tenant-{i}" for i in range(spec.tenants)}
    assert all(x.arrival_s <= y.arrival_s for x, y in zip(a, a[1:], strict=False))


def test_demo_runs_compares_and_plots(tmp_path):
    png = tmp_path / "demo.png"
    result = CliRunner().invoke(app, ["demo", "--requests", "12", "--workers", "2",
                                      "--rate", "20", "--plot", str(png)])
    assert result.exit_code == 0, result.output
    last = result.output.strip().splitlines()[-2:]
    assert "verdict: kvmesh vs round robin" in " ".join(last)
    assert "policy: kvmesh" in result.output and "policy: round_robin" in result.output
    assert png.stat().st_size > 10_000
