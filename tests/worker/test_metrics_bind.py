"""Attack: a worker's ``/metrics`` (no authentication) bound to the worker's own interface.

A worker serving gRPC on every interface (``--host 0.0.0.0``) used to serve ``/metrics``
there too, readable by anyone on the network. ``/metrics`` now binds ``--metrics-host``,
loopback by default. A real ``kvmesh worker`` process is checked from the kernel's socket
table (``psutil``): its metrics port listens on 127.0.0.1 only.
"""
from __future__ import annotations

import re
import urllib.request

import psutil
import pytest

from deploy.process import ServerProcess

pytestmark = pytest.mark.integration  # a worker process


def _listening(pid: int) -> dict[int, set[str]]:
    """Listening TCP ports of ``pid``: port -> bound addresses."""
    out: dict[int, set[str]] = {}
    for c in psutil.Process(pid).net_connections(kind="tcp"):
        if c.status == psutil.CONN_LISTEN:
            out.setdefault(c.laddr.port, set()).add(c.laddr.ip)
    return out


def test_metrics_listen_on_loopback_even_when_the_worker_host_is_public() -> None:
    proc = ServerProcess("w", "worker", ["--host", "0.0.0.0", "--port", "0", "--num-blocks",
                                         "16", "--device", "cpu", "--metrics-port", "0"])
    proc.start(timeout=120)
    try:
        line = next(x for x in proc.lines if "listening on" in x)
        mport = int(re.search(r"metrics on :(\d+)", line)[1])
        assert _listening(proc.pid)[mport] == {"127.0.0.1"}
        body = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10).read()
        assert b"kvmesh_worker_kv_blocks_total" in body
    finally:
        proc.stop()
