"""`kvmesh bench soak`: mixed load with periodic faults, RSS of every process over time.

A local cluster (embedded Valkey, two service replicas, N workers) serves a request loop
from a few threads (shared system prompts, several tenants, growing chats) while a fault
happens every ``--fault-every`` seconds, in turn: a worker killed (SIGKILL) and replaced, a
service replica killed and restarted, a worker frozen (SIGSTOP) for 5 s, Redis killed and
restarted empty. Every ``--interval`` seconds it prints requests done / failed and the
resident memory of the service replicas and workers; at the end, each long-lived process's
RSS growth from its first warm sample (after a first minute of warm-up) to the last: it must
stay flat, unlike the radix-tree leaks reported against other routers.
"""
from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from dataclasses import asdict

import typer

from bench.rss import rss_mib, table, trends


class Load:
    """Requests in a loop from ``threads`` threads; counts done and failed."""

    def __init__(self, addresses: list[str], threads: int = 3, seed: int = 0) -> None:
        self.addresses = addresses
        self.done = self.failed = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        rng = random.Random(seed)
        self.systems = [[rng.randrange(256) for _ in range(512)] for _ in range(4)]
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                         for i in range(threads)]

    def _run(self, seed: int) -> None:
        from client import KvmeshClient, KvmeshError

        rng = random.Random(seed)
        with KvmeshClient(self.addresses, generate_timeout=10.0) as client:
            chat: list[int] = []
            while not self._stop.is_set():
                tenant = rng.randrange(len(self.systems))
                if not chat or len(chat) > 3000 or rng.random() < 0.2:
                    chat = list(self.systems[tenant])
                chat += [rng.randrange(256) for _ in range(32)]
                try:
                    res = client.generate(chat, max_tokens=8, salt=f"t{tenant}", ignore_eos=True)
                    chat += res.token_ids
                    with self._lock:
                        self.done += 1
                except KvmeshError as exc:
                    with self._lock:
                        self.failed += 1
                        self.errors.append(str(exc))

    def start(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)


def inject(cluster, step: int, log) -> None:
    """The ``step``-th fault, cycling through the four kinds."""
    kind = step % 4
    alive = [w for w in cluster.workers if w.alive]
    if kind == 0 and alive:
        victim = alive[0]
        victim.kill()
        cluster.add_worker(f"worker-r{step}")
        log(f"killed {victim.name} (SIGKILL), started worker-r{step}")
    elif kind == 1:
        port = int(cluster.services[0].address.rpartition(":")[2])
        cluster.services[0].kill()
        time.sleep(2)
        cluster.start_service(0, port=port)
        log("killed service-0 (SIGKILL) and restarted it")
    elif kind == 2 and alive:
        frozen = alive[-1]
        os.kill(frozen.pid, signal.SIGSTOP)
        time.sleep(5)
        os.kill(frozen.pid, signal.SIGCONT)
        log(f"froze {frozen.name} for 5 s (SIGSTOP/SIGCONT)")
    elif kind == 3:
        cluster.redis.kill()
        time.sleep(3)
        cluster.redis.start()
        log("killed Redis and restarted it empty")


def run(minutes: float, workers: int, fault_every: float, interval: float,
        warmup_s: float, as_json: bool) -> dict:
    from deploy.local import ClusterSpec, LocalCluster

    def log(msg: str) -> None:
        if not as_json:
            print(f"[{time.monotonic() - t0:7.1f}s] {msg}", flush=True)

    cluster = LocalCluster(ClusterSpec(workers=workers, service_replicas=2, num_blocks=256))
    cluster.start()
    t0 = time.monotonic()
    load = Load(cluster.service_addresses).start()
    samples: list[dict] = []
    next_fault, next_sample, step = t0 + fault_every, t0, 0
    end = t0 + minutes * 60
    try:
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_sample:
                alive = [p for p in cluster.services + cluster.workers if p.alive]
                procs = {p.name: rss_mib(p.pid) for p in alive}
                samples.append({"t": round(now - t0, 1), "done": load.done,
                                "failed": load.failed, "rss_mib": procs,
                                "pid": {p.name: p.pid for p in alive}})
                log(f"done {load.done:6d}  failed {load.failed:3d}  rss MiB "
                    + " ".join(f"{k}={v:.0f}" for k, v in procs.items()))
                next_sample = now + interval
            if now >= next_fault:
                inject(cluster, step, log)
                step += 1
                next_fault = time.monotonic() + fault_every
            time.sleep(0.5)
    finally:
        load.stop()
        cluster.stop()
    return {"minutes": minutes, "done": load.done, "failed": load.failed,
            "faults": step, "warmup_s": warmup_s,
            "rss": [{**asdict(r), "verdict": r.verdict()} for r in trends(samples, warmup_s)],
            "errors": load.errors[:5], "samples": samples}


def register(bench: typer.Typer) -> None:
    @bench.command("soak")
    def soak(minutes: float = typer.Option(10.0, help="how long to run"),
             workers: int = typer.Option(3),
             fault_every: float = typer.Option(45.0, help="seconds between faults"),
             interval: float = typer.Option(30.0, help="seconds between samples"),
             warmup: float = typer.Option(60.0, help="seconds of each process's life "
                                          "before its RSS counts as warm"),
             as_json: bool = typer.Option(False, "--json")) -> None:
        """Mixed load with periodic faults; requests done/failed and RSS over time."""
        res = run(minutes, workers, fault_every, interval, warmup, as_json)
        if as_json:
            print(json.dumps(res))
            return
        print(f"requests done {res['done']}, failed {res['failed']}, faults {res['faults']}")
        print(*table(trends(res["samples"], warmup), warmup), sep="\n")
        if res["errors"]:
            print("first errors:", *res["errors"], sep="\n  ")
