"""Attack: one bound worker token points the gateway's traffic, engine key and tenants' salts
at an address of its choosing, and reads other tenants' cache hits on the gateway's
``/metrics``.

Real processes: ``kvmesh service`` (router token, worker secret) and ``kvmesh gateway`` with
tenant keys, an engine key (``KVMESH_ENGINE_API_KEY``) and one listed engine
(``KVMESH_ENGINE_ALLOW``), its metrics on a listener of their own. The operator's engine
registers with its own bound token; the attacker, holding the bound token of ``gpu-9``,
registers ``http://127.0.0.1:<its port>`` and heartbeats. Whatever the index routes to, the
attacker's server receives nothing, and the engine key reaches only the listed engine.
"""
from __future__ import annotations

import re
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import httpx2
import pytest

from deploy.process import ServerProcess
from deploy.waiting import wait_until
from kvmesh.hashing import none_hash
from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc
from service.worker_tokens import mint
from tests.client.gateway.recording_engine import RecordingEngine
from tests.ports import free_port

pytestmark = pytest.mark.integration

ROUTER, SECRET = "router-" + secrets.token_hex(8), "secret-" + secrets.token_hex(16)
ENGINE_KEY, TENANT_KEY = "vllm-engine-key-" + secrets.token_hex(8), "sk-acme"
_METRICS = re.compile(r"gateway metrics on \S+:(\d+)")


@dataclass
class Scene:
    gateway: str            # the gateway's API base URL
    metrics: str            # its own metrics listener's /metrics
    engine: RecordingEngine  # the operator's engine, listed
    attacker: RecordingEngine


class Registered:
    """Workers registered with their own bound tokens, heartbeating until ``stop``."""

    def __init__(self, service: str) -> None:
        self.channel = grpc.insecure_channel(service)
        grpc.channel_ready_future(self.channel).result(timeout=30)
        self.stub = index_pb2_grpc.IndexServiceStub(self.channel)
        self.workers: list[tuple[str, int]] = []
        self._stop = threading.Event()
        threading.Thread(target=self._beat, daemon=True).start()

    def add(self, worker_id: str, address: str) -> None:
        inc, load = secrets.randbits(62) + 1, pb.WorkerLoad(free_blocks=4096, total_blocks=4096)
        self.stub.RegisterWorker(pb.RegisterWorkerRequest(
            worker_id=worker_id, address=address, model="tiny", block_size=16,
            hash_algo="sha256_cbor", root_hash=none_hash(), load=load, incarnation=inc),
            metadata=self._md(worker_id), timeout=10)
        self.workers.append((worker_id, inc))

    def _md(self, worker_id: str) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {mint(SECRET, worker_id)}"),)

    def _beat(self) -> None:
        while not self._stop.wait(0.3):
            for worker_id, inc in list(self.workers):
                try:
                    self.stub.Heartbeat(pb.HeartbeatRequest(
                        worker_id=worker_id, incarnation=inc, load=pb.WorkerLoad(
                            free_blocks=4096, total_blocks=4096)),
                        metadata=self._md(worker_id), timeout=5)
                except grpc.RpcError:
                    pass

    def stop(self) -> None:
        self._stop.set()
        self.channel.close()


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    engine, attacker = RecordingEngine(), RecordingEngine()
    keys = tmp_path_factory.mktemp("gw") / "tenant-keys"
    keys.write_text(f"{TENANT_KEY} acme\nsk-globex globex\n")
    keys.chmod(0o600)
    service = ServerProcess("service", "service", [
        "--backend", "memory", "--host", "127.0.0.1", "--port", "0"],
        env={"KVMESH_TOKEN": ROUTER, "KVMESH_WORKER_SECRET": SECRET}).start()
    port = free_port()
    gateway = subprocess.Popen(
        [sys.executable, "-c", "from client.cli import app; app()", "gateway", "--service",
         service.address, "--port", str(port), "--tenant-keys", str(keys),
         "--metrics-port", "0", "--log-level", "warning"],
        env={**service.env, "KVMESH_TOKEN": ROUTER, "KVMESH_ENGINE_API_KEY": ENGINE_KEY,
             "KVMESH_ENGINE_ALLOW": engine.url},
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    workers = Registered(service.address)
    try:
        line = next(x for x in gateway.stderr if "metrics on" in x or "error" in x)
        threading.Thread(target=lambda: [None for _ in gateway.stderr], daemon=True).start()
        metrics = f"http://127.0.0.1:{_METRICS.search(line).group(1)}/metrics"
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _up(url), 60, what="gateway up")
        workers.add("engine-0", engine.url)
        workers.add("gpu-9", attacker.url)  # the attacker: one bound token, its own id
        yield Scene(url, metrics, engine, attacker)
    finally:
        workers.stop()
        gateway.terminate()
        gateway.wait(15)
        service.stop()
        engine.stop()
        attacker.stop()


def _up(url: str) -> bool:
    """The gateway listens (``/ping``: ``/health`` waits for a live worker, none yet)."""
    try:
        return httpx2.get(f"{url}/ping", timeout=2).status_code == 200
    except httpx2.HTTPError:
        return False


def ask(scene: Scene, prompt: str) -> httpx2.Response:
    return httpx2.post(f"{scene.gateway}/v1/completions", timeout=30,
                       headers={"authorization": f"Bearer {TENANT_KEY}"},
                       json={"model": "tiny", "prompt": prompt, "max_tokens": 2})


def test_a_worker_registered_address_receives_no_prompt_salt_or_engine_key(scene: Scene):
    def served() -> bool:
        return ask(scene, "warm-up").status_code == 200

    wait_until(served, 30, interval=0.3, what="the listed engine serving")
    for i in range(8):  # the index offers both; ties break at random
        answer = ask(scene, f"Q3 layoffs list {i}: Alice, Bob")
        assert answer.status_code == 200 and answer.headers["x-kvmesh-worker"] == "engine-0"
    assert scene.attacker.requests == []
    assert set(scene.engine.keys) == {f"Bearer {ENGINE_KEY}"}
    assert all(r["body"].get("cache_salt") for r in scene.engine.requests)


def test_tenants_read_no_metrics_the_operator_reads_them_on_their_own_port(scene: Scene):
    ask(scene, "anything")
    for headers in ({}, {"authorization": f"Bearer {TENANT_KEY}"}):
        got = httpx2.get(f"{scene.gateway}/metrics", headers=headers, timeout=5)
        assert got.status_code == 404 and "cached_tokens" not in got.text
    page = httpx2.get(scene.metrics, timeout=5)
    assert page.status_code == 200 and "kvmesh_gateway_requests_total" in page.text
    refused = re.search(r'^kvmesh_gateway_engine_forwards_total\{outcome="refused"\} (\S+)$',
                        page.text, re.M)
    assert refused and float(refused.group(1)) > 0  # the attacker was offered, and refused
