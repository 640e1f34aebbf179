"""Faults survived with nothing lost, on real processes (issue: reliability, section 1).

One cluster (embedded Valkey, two service replicas, three tiny-model workers) serves a
request loop while the faults happen one after another: a worker killed mid-generation, a
service replica killed, Redis killed and restarted empty, a worker frozen (SIGSTOP: process
alive, heartbeats stopped) and resumed. Every request of the loop must complete, and every
greedy output must equal the same prompt's output on a fresh engine with an empty cache.
"""
from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest

from client import KvmeshClient, KvmeshError
from deploy.local import ClusterSpec, LocalCluster
from deploy.waiting import wait_until

pytestmark = pytest.mark.integration  # a real local cluster, faults injected

MAX_TOKENS = 12
SYSTEMS = [[random.Random(s).randrange(256) for _ in range(160)] for s in range(3)]
PROMPTS = [(sys_ + [random.Random(100 + 7 * i + q).randrange(256) for _ in range(12)],
            f"tenant-{i}") for i, sys_ in enumerate(SYSTEMS) for q in range(4)]


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    """Greedy outputs on a fresh engine, prefix cache emptied before every prompt."""
    from worker import Engine

    engine = Engine.from_pretrained("tiny", num_blocks=128)
    out = []
    for tokens, salt in PROMPTS:
        assert engine.kv.reset_prefix_cache()
        out.append(engine.generate([tokens], max_tokens=MAX_TOKENS, salt=salt,
                                   ignore_eos=True)[0].token_ids)
    return out


@pytest.fixture(scope="module")
def cluster():
    c = LocalCluster(ClusterSpec(workers=3, service_replicas=2, num_blocks=128))
    c.start(timeout=120)
    yield c
    for w in c.workers:  # a frozen worker cannot handle SIGTERM
        if w.alive:
            os.kill(w.pid, signal.SIGCONT)
    c.stop()


class RequestLoop:
    """Requests in a loop from a few threads until stopped; records every outcome."""

    def __init__(self, addresses: list[str], threads: int = 2) -> None:
        self.addresses = addresses
        self.done: list[tuple[int, list[int], str]] = []
        self.failed: list[tuple[int, str]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                         for i in range(threads)]

    def _run(self, seed: int) -> None:
        rng = random.Random(seed)
        # A short per-attempt deadline: a frozen worker costs one attempt, not the request.
        with KvmeshClient(self.addresses, generate_timeout=8.0) as client:
            while not self._stop.is_set():
                i = rng.randrange(len(PROMPTS))
                tokens, salt = PROMPTS[i]
                try:
                    res = client.generate(tokens, max_tokens=MAX_TOKENS, salt=salt,
                                      ignore_eos=True)
                    self.done.append((i, res.token_ids, res.worker_id))
                except KvmeshError as exc:
                    self.failed.append((i, str(exc)))
                self._stop.wait(0.02)  # pacing: a steady load, not a flood

    def __enter__(self) -> RequestLoop:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)


def live_workers(client: KvmeshClient) -> set[str]:
    try:
        return {c.worker_id for c in client.route(PROMPTS[0][0], dry_run=True).candidates}
    except KvmeshError:
        return set()


def test_request_loop_survives_every_fault(cluster, reference):
    client = KvmeshClient(cluster.service_addresses)
    with RequestLoop(cluster.service_addresses) as loop:
        wait_until(lambda: len(loop.done) >= 6, timeout=30)

        # 1. kill -9 a worker in the middle of a long generation: the client fails over.
        long_prompt, salt = PROMPTS[5]
        result: dict = {}
        t = threading.Thread(target=lambda: result.update(
            r=client.generate(long_prompt, max_tokens=400, salt=salt, ignore_eos=True)))
        t.start()
        busy = wait_until(lambda: next((w for w in cluster.workers if w.alive and
                                        client.worker_stats(w.address)["load"]["running"] > 0
                                        and w.name == client.route(long_prompt, salt=salt,
                                                               dry_run=True).worker_id), None),
                          timeout=20, interval=0.05)
        busy.kill()
        killed_at = time.monotonic()
        wait_until(lambda: busy.name not in live_workers(client), timeout=3.5, interval=0.05)
        assert time.monotonic() - killed_at <= 3.5
        t.join(timeout=120)
        assert result["r"].worker_id != busy.name and len(result["r"].token_ids) == 400
        assert result["r"].token_ids[:MAX_TOKENS] == reference[5]
        cluster.add_worker("worker-3")  # a replacement joins
        wait_until(lambda: "worker-3" in live_workers(client), timeout=30)

        # 2. kill -9 one service replica: clients fail over to the other.
        port = int(cluster.services[0].address.rpartition(":")[2])
        n = len(loop.done)
        cluster.services[0].kill()
        wait_until(lambda: len(loop.done) >= n + 4, timeout=30)
        cluster.start_service(0, port=port)

        # 3. Redis killed, then restarted EMPTY: Route answers degraded, never an error;
        #    workers resync and the index is whole again within 10 s.
        cluster.redis.kill()
        degraded = wait_until(lambda: client.route(PROMPTS[0][0], dry_run=True).degraded, timeout=5)
        assert degraded
        n = len(loop.done)
        wait_until(lambda: len(loop.done) >= n + 3, timeout=30)  # still serving
        cluster.redis.start()
        t0 = time.monotonic()

        def index_whole() -> bool:
            st = client.stats()
            alive = [w for w in st["workers"] if w["alive"]]
            if st["degraded"] or len(alive) < 3:
                return False
            return all(w["indexed_blocks"] == client.worker_stats(w["address"])["cache"][
                "cached_hashes"] for w in alive)

        wait_until(index_whole, timeout=15, interval=0.2)
        assert time.monotonic() - t0 <= 15  # 10 s goal; slack for a loaded CI machine

        # 4. A worker cut off (process alive, heartbeats stopped) leaves routing; when it
        #    comes back it rejoins with a snapshot.
        frozen = next(w for w in cluster.workers if w.alive and w.name != "worker-3")
        os.kill(frozen.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: frozen.name not in live_workers(client), timeout=5, interval=0.05)
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
        wait_until(lambda: frozen.name in live_workers(client), timeout=10)
        wait_until(index_whole, timeout=10, interval=0.2)

        n = len(loop.done)
        wait_until(lambda: len(loop.done) >= n + 4, timeout=30)
    client.close()

    # Nothing lost: every request completed, and every output is the fresh-engine output.
    assert not loop.failed, loop.failed[:3]
    assert len(loop.done) >= 20
    for i, tokens, worker in loop.done:
        assert tokens == reference[i], (i, worker)
