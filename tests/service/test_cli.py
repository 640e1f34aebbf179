"""``python -m service`` / ``kvmesh service`` run as a real process and stop on SIGTERM."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest
import typer
from typer.testing import CliRunner

from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc as pb_grpc
from service.cli import config_of, register
from service.config import CostWeights, parse_cost_weights

ROOT = Path(__file__).resolve().parents[2]


def test_register_adds_the_service_command() -> None:
    app = typer.Typer()
    register(app)

    @app.command("other")
    def other() -> None:  # a second command, so "service" is a subcommand as in kvmesh
        pass

    res = CliRunner().invoke(app, ["service", "--help"])
    assert res.exit_code == 0
    for flag in ("--port", "--redis-url", "--backend", "--token", "--worker-token",
                 "--metrics-port", "--hash-seed", "--policy", "--worker-secret", "--tls-ca",
                 "--tls-client-auth", "--max-message-bytes", "--max-prompt-tokens",
                 "--cpu-credit", "--disk-credit"):
        assert flag in res.output


def test_credit_flags_override_the_measured_credits() -> None:
    from service.cli import config_of

    none = dict(token=None, worker_token=None, worker_secret=None)
    cfg = config_of("auto", None, cpu_credit=0.7, **none)
    assert (cfg.weights.cpu_credit, cfg.weights.disk_credit) == (0.7, None)
    assert config_of("auto", None, **none).weights.cpu_credit is None  # measured
    app = typer.Typer()
    register(app)
    app.command("other")(lambda: None)
    res = CliRunner().invoke(app, ["service", "--disk-credit", "1.5"])
    assert res.exit_code == 2 and "disk_credit must be in [0, 1]" in res.output


def test_python_m_service_serves_and_stops(redis_url: str) -> None:
    env = {**os.environ, "KVMESH_TOKEN": "tok", "KVMESH_WORKER_SECRET": "w" * 16,
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "--port", "0", "--redis-url", redis_url,
         "--metrics-port", "0", "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on 127.0.0.1:" in line, line
        port = int(line.split("127.0.0.1:")[1].split()[0])
        metrics_port = int(line.split("metrics on :")[1].rstrip(")\n"))

        async def call() -> pb.StatsResponse:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = pb_grpc.IndexServiceStub(ch)
                return await stub.Stats(pb.StatsRequest(),
                                        metadata=(("authorization", "Bearer tok"),))

        assert list(asyncio.run(call()).workers) == []
        body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read()
        for name in (b"kvmesh_routes_total", b"kvmesh_route_latency_seconds",
                     b"kvmesh_live_workers", b"kvmesh_degraded_answers_total"):
            assert name in body
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- ``kvmesh service --cost-weight NAME=VALUE`` and ``--route-log``: flags into ServiceConfig.

NONE = dict(token=None, worker_token=None, worker_secret=None)


def _invoke(*args: str) -> tuple[int, str]:
    app = typer.Typer()
    register(app)
    app.command("other")(lambda: None)  # a second command: "service" is a subcommand
    res = CliRunner().invoke(app, ["service", *args])
    return res.exit_code, res.output


def test_cost_weights_fold_into_the_config() -> None:
    cfg = config_of("auto", None, cost_weight=["saturation_weight=0", "wait_weight=0.5",
                                               "saturation_weight=0.25"], **NONE)
    assert cfg.weights == CostWeights(saturation_weight=0.25, wait_weight=0.5)
    assert config_of("auto", None, **NONE).weights == CostWeights()
    # the credit flags keep working, beside the weights
    cfg = config_of("auto", None, cpu_credit=0.7, cost_weight=["queue_weight=2"], **NONE)
    assert (cfg.weights.cpu_credit, cfg.weights.queue_weight) == (0.7, 2.0)
    cfg = config_of("auto", None, cost_weight=["disk_credit=0.1"], **NONE)
    assert cfg.weights.disk_credit == 0.1


@pytest.mark.parametrize("items, error", [
    (["bogus=1"], "NAME one of prefill_weight, queue_weight"),
    (["saturation_weight"], "expected NAME=VALUE"),
    (["queue_weight=fast"], "'fast' is not a number"),
])
def test_a_bad_weight_names_the_valid_ones(items: list[str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_cost_weights(items)


def test_the_command_refuses_bad_weights_as_usage_errors() -> None:
    code, out = _invoke("--cost-weight", "bogus=1")
    assert code == 2 and "saturation_weight" in out and "bogus" in out
    code, out = _invoke("--cost-weight", "wait_weight=-1")
    assert code == 2 and "wait_weight must be >= 0" in out
    code, out = _invoke("--cpu-credit", "0.5", "--cost-weight", "cpu_credit=0.2")
    assert code == 2 and "both set" in out
    code, out = _invoke("--help")
    assert code == 0 and "--cost-weight" in out and "--route-log" in out


def test_route_log_is_a_config_field_off_by_default(tmp_path) -> None:
    assert config_of("auto", None, **NONE).route_log is None
    path = str(tmp_path / "r.jsonl")
    assert config_of("auto", None, route_log=path, **NONE).route_log == path


def _config(*args: str):
    """The ServiceConfig ``kvmesh service ARGS`` would run with (parsed, not served)."""
    app = typer.Typer()
    register(app)
    app.command("other")(lambda: None)
    params = typer.main.get_command(app).get_command(None, "service").make_context(
        "service", list(args)).params
    for own in ("port", "host", "log_level"):
        params.pop(own)
    return config_of(**params)


def test_peer_fetch_flags_reach_the_kvmesh_policy() -> None:
    from service.policy import make_policies

    off = _config()
    assert (off.peer_fetch, off.min_fetch_blocks, off.fetch_costs.enabled) == (False, 4, False)
    on = _config("--peer-fetch", "--min-fetch-blocks", "7", "--fetch-ticket-ttl-s", "5")
    assert on.fetch_costs.enabled and on.fetch_costs.min_fetch_blocks == 7
    assert on.fetch_ticket_ttl_s == 5.0
    assert make_policies(on.weights, on.fetch_costs)["kvmesh"].fetch == on.fetch_costs
    assert not _config("--peer-fetch", "--no-peer-fetch").peer_fetch  # the last one wins
    code, out = _invoke("--min-fetch-blocks", "0")
    assert code == 2 and "min_fetch_blocks must be >= 1" in out
