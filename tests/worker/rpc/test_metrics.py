"""Attack: a worker's ``/metrics`` (no authentication) bound to the worker's own interface.

A worker serving gRPC on every interface (``--host 0.0.0.0``) used to serve ``/metrics``
there too, readable by anyone on the network. ``/metrics`` now binds ``--metrics-host``,
loopback by default. A real ``kvmesh worker`` process is checked from the kernel's socket
table (``psutil``): its metrics port listens on 127.0.0.1 only.
"""
from __future__ import annotations

import re
import urllib.error
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


def test_the_http_apis_vllm_metrics_are_on_the_loopback_metrics_listener_only() -> None:
    """``--http-port`` faces callers; its vLLM page (every caller's prefix-cache hits) is on
    the metrics listener (a free loopback port without ``--metrics-port``), not next to it."""
    proc = ServerProcess("w", "worker", ["--host", "0.0.0.0", "--port", "0", "--num-blocks",
                                         "16", "--device", "cpu", "--http-port", "0"])
    proc.start(timeout=120)
    try:
        line = next(x for x in proc.lines if "listening on" in x)
        hport = int(re.search(r"HTTP on :(\d+)", line)[1])
        mport = int(re.search(r"metrics on :(\d+)", line)[1])
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{hport}/metrics", timeout=10)
        assert err.value.code == 404
        assert _listening(proc.pid)[mport] == {"127.0.0.1"}
        body = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10).read()
        assert b"vllm:prefix_cache_hits_total" in body
        assert b"kvmesh_worker_kv_blocks_total" in body
    finally:
        proc.stop()
