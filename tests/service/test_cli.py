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
import typer
from typer.testing import CliRunner

from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc as pb_grpc
from service.cli import register

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
