"""`kvmesh bench bridge`: blocks per second one bridge process ingests, and the lag from an
engine's publish to a routable index at that rate.

A service, the load (vLLM-like publishers, their own process) and ONE bridge process; per
offered rate: ingest and CPU per block, publish-to-routable latency by probe, the stream's
and the index side's health. ``--bridge-core N`` gives the bridge a core of its own.

See docs/architecture.md#index-route-and-bridge-benches.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import typer
import zmq
from prometheus_client.parser import text_string_to_metric_families

from client.sync_client import KvmeshClient
from deploy.ports import free_port
from deploy.process import ServerProcess
from deploy.redis_server import RedisServer
from deploy.waiting import wait_until
from kvmesh.events import vllm as ve
from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc as pb_grpc

GOAL_BLOCKS_PER_S, GOAL_P99_S = 200_000, 0.050


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (``/proc``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of ``pid``'s threads by kind: ``loop`` (the main thread: the ingest loop,
    i.e. ZMQ receives, decode, engine state, the links' publishes), ``zmq`` (libzmq's I/O
    threads), ``grpc`` (gRPC core's threads that name themselves) and ``other`` (the beat
    thread's heartbeats and scrapes, the metrics server, asyncio's executor, gRPC's unnamed
    poller)."""
    out = dict.fromkeys(("loop", "zmq", "grpc", "other"), 0.0)
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        kind = ("loop" if int(tid) == pid else "zmq" if name.startswith("ZMQ")
                else "grpc" if name.startswith(("grpc", "event_engine", "default-executo"))
                else "other")
        out[kind] += (int(fields[11]) + int(fields[12])) / tick
    return out


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Stack:
    """Service, load and bridge processes (``close`` stops them all)."""

    def __init__(self, engines: int, blocks: int, backend: str, uniform: bool,
                 requests: int = 4, bulk_removals: bool = False,
                 bridge_core: int | None = None) -> None:
        # a core of its own for the bridge, as a deployment gives it: this process and the
        # ones it starts next (service, load) keep off it; restored by ``close``
        self.cpus = os.sched_getaffinity(0)
        if bridge_core is not None:
            others = self.cpus - {bridge_core}
            if bridge_core not in self.cpus or not others:
                raise ValueError(f"--bridge-core {bridge_core}: this process may run on CPUs "
                                 f"{sorted(self.cpus)}; the bridge needs one of them and the "
                                 f"rest at least one other")
            os.sched_setaffinity(0, others)
        self.tmp = tempfile.TemporaryDirectory(prefix="kvmesh-bench-bridge-")
        self.redis = (RedisServer(free_port()).start()
                      if backend == "redis" else None)
        env = {"KVMESH_REDIS_URL": self.redis.url} if self.redis else {}
        self.service = ServerProcess("bench-service", "service", [
            "--port", "0", "--log-level", "warning", "--backend", backend], env=env).start()
        self.load = subprocess.Popen(
            [sys.executable, "-m", "bench.bridge.load", "--engines", str(engines), "--blocks",
             str(blocks), "--requests", str(requests), *(["--uniform"] if uniform else []),
             *(["--bulk-removals"] if bulk_removals else [])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        info = json.loads(self.load.stdout.readline())
        self.probe = zmq.Context.instance().socket(zmq.PUB)
        self.probe.bind("tcp://127.0.0.1:*")
        self.probe_seq = 0
        specs = [{"worker-id": f"bench-e{i}", "address": info["metrics"], "model": "bench",
                  "metrics-url": f"{info['metrics']}/e{i}/metrics", **e}
                 for i, e in enumerate(info["engines"])]
        specs.append({"worker-id": "bench-probe", "address": info["metrics"], "model": "bench",
                      "metrics-url": f"{info['metrics']}/probe/metrics",
                      "events": self.probe.getsockopt_string(zmq.LAST_ENDPOINT)})
        config = Path(self.tmp.name) / "fleet.json.yaml"
        config.write_text(json.dumps({"engines": specs}))
        self.metrics_port = free_port()
        cmd = [str(Path(sys.executable).parent / "kvmesh"), "bridge", "vllm", "--config",
               str(config), "--service", self.service.address, "--metrics-port",
               str(self.metrics_port)]
        if bridge_core is not None:  # pinned before exec: every thread it starts inherits it
            cmd = [sys.executable, "-c", "import os, sys; os.sched_setaffinity(0, "
                   f"{{{bridge_core}}}); os.execv(sys.argv[1], sys.argv[1:])", *cmd]
        self.bridge = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
        self.client = KvmeshClient(self.service.address)
        self.channel = grpc.insecure_channel(self.service.address)
        self.index = pb_grpc.IndexServiceStub(self.channel)  # Route with a model name
        self.workers = [s["worker-id"] for s in specs]
        wait_until(self._all_live, 60, what="every engine registered and streaming")
        self.bridge_cpus = sorted(os.sched_getaffinity(self.bridge.pid))  # as it runs

    def command(self, line: str) -> dict:
        self.load.stdin.write(line + "\n")
        self.load.stdin.flush()
        return json.loads(self.load.stdout.readline())

    def scrape(self) -> dict[str, float]:
        """The bridge's counters summed over workers, and its lag histogram's buckets."""
        page = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                      timeout=5).read().decode()
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(page):
            for s in family.samples:
                key = s.name + (f"|{s.labels['le']}" if "le" in s.labels else "")
                out[key] = out.get(key, 0.0) + s.value
        return out

    def _all_live(self) -> bool:
        self.command("warm")
        self._probe_batch([])  # the probe engine is this process's: warm it too
        alive = {w["worker_id"] for w in self.client.stats()["workers"] if w["alive"]}
        return set(self.workers) <= alive and self.scrape().get(
            "kvmesh_bridge_messages_total", 0) >= len(self.workers)

    def _probe_batch(self, events: list) -> float:
        """Publish one batch on the probe engine; returns its time stamp."""
        t = time.time()
        payload = ve.encode_batch(ve.KVEventBatch(ts=t, events=events, data_parallel_rank=0))
        self.probe.send_multipart(ve.pack_message(b"", self.probe_seq, payload))
        self.probe_seq += 1
        return t

    def probe_lag(self, n: int) -> float | None:
        """Publish probe ``n`` and wait until it is routable; seconds, None past 10 s."""
        tokens = [(n * 7919 + i * 104729) % 128_000 for i in range(32)]
        t = self._probe_batch([ve.VllmStored(
            block_hashes=[2 * n + 1, 2 * n + 2], parent_block_hash=None, token_ids=tokens,
            block_size=16, lora_id=None, medium="GPU", lora_name=None)])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                routed = self.index.Route(pb.RouteRequest(
                    token_ids=[*tokens, 0], model="bench", dry_run=True), timeout=5)
            except grpc.RpcError:  # no live engine (an overloaded bridge misses beats)
                routed = pb.RouteResponse()
            if any(c.worker_id == "bench-probe" and c.matched_tokens == 32
                   for c in routed.candidates):
                return time.time() - t
            # every Route costs the service (which the bridge's events wait for) ~0.3 ms:
            # 2 ms apart up to the goal, where the precision matters, 10 ms past it
            time.sleep(0.002 if time.time() - t < GOAL_P99_S else 0.010)
        return None

    def measure(self, rate: float, seconds: float, probes: float) -> dict:
        before, t0 = self.scrape(), time.time()
        cpu0, svc0 = cpu_s(self.bridge.pid), cpu_s(self.service.pid)
        threads0 = thread_cpu_s(self.bridge.pid)
        lags: list[float | None] = []
        done = threading.Event()

        sent = [0]  # probe batches published (the bridge counts them as messages too)

        def prober() -> None:
            while not done.wait(1 / probes):
                sent[0] += 1
                lags.append(self.probe_lag(sent[0] + int(t0)))

        thread = threading.Thread(target=prober, daemon=True)
        thread.start()
        run = self.command(f"run {rate} {seconds}")
        # caught up: every batch published was applied or, by a lag clear, skipped unread
        # (every scrape costs the bridge a few ms of CPU: polled at 10/s, not 20)
        def taken(m: dict[str, float]) -> float:
            return (m.get("kvmesh_bridge_messages_total", 0)
                    + m.get("kvmesh_bridge_skipped_batches_total", 0))

        want = taken(before) + run["batches"]
        caught = wait_until(lambda: taken(self.scrape()) >= want + sent[0] and time.time(),
                            300, interval=0.1, what="the bridge to catch up")
        wall, cpu = caught - t0, cpu_s(self.bridge.pid) - cpu0
        threads = {k: v - threads0[k] for k, v in thread_cpu_s(self.bridge.pid).items()}
        done.set()
        thread.join()
        after = self.scrape()
        svc = cpu_s(self.service.pid) - svc0
        delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
        seen = [x for x in lags if x is not None]
        publishes = delta.get("kvmesh_bridge_publishes_total", 0)
        # blocks the bridge applied (lag clears skip some: they are not ingested)
        applied = delta.get("kvmesh_bridge_blocks_stored_total", 0) - 2 * len(lags)
        return {
            "offered_blocks_per_s": rate, "stored_blocks": run["stored_blocks"],
            "publish_s": round(run["seconds"], 3), "publisher_late_s": round(run["late_s"], 3),
            "applied_blocks": int(applied),
            "wall_s": round(wall, 3), "ingest_blocks_per_s": round(applied / wall),
            "bridge_cpu_s": round(cpu, 3),
            "blocks_per_bridge_cpu_s": round(applied / cpu) if cpu else None,
            "service_cpu_s": round(svc, 3),
            # the bridge's CPU per stored block, by thread kind (``thread_cpu_s``)
            "bridge_us_per_block": round(cpu / max(applied, 1) * 1e6, 2),
            **{f"{k}_us_per_block": round(v / max(applied, 1) * 1e6, 2)
               for k, v in threads.items()},
            "probe_lag_p50_ms": round(percentile(seen, 0.5) * 1e3, 1),
            "probe_lag_p99_ms": round(percentile(seen, 0.99) * 1e3, 1),
            "probe_lag_max_ms": round(max(seen, default=float("nan")) * 1e3, 1),
            "probes": len(lags), "probes_lost": len(lags) - len(seen),
            "bridge_lag_p50_le_ms": _hist_ms(delta, 0.5),
            "bridge_lag_p99_le_ms": _hist_ms(delta, 0.99),
            "gaps": int(delta.get("kvmesh_bridge_gaps_total", 0)),
            "replays": int(delta.get("kvmesh_bridge_replays_total", 0)),
            "clears": int(delta.get("kvmesh_bridge_unfilled_total", 0)
                          + delta.get("kvmesh_bridge_restarts_total", 0)),
            "resyncs": int(delta.get("kvmesh_bridge_resyncs_total", 0)),
            "overflows": int(delta.get("kvmesh_bridge_overflows_total", 0)),
            "sheds": int(delta.get("kvmesh_bridge_sheds_total", 0)),
            "lag_clears": int(delta.get("kvmesh_bridge_lag_clears_total", 0)),
            "skipped_batches": int(delta.get("kvmesh_bridge_skipped_batches_total", 0)),
            "stale_beats": int(delta.get("kvmesh_bridge_stale_beats_total", 0)),
            "silent_beats": int(delta.get("kvmesh_bridge_silent_beats_total", 0)),
            "registrations": int(delta.get("kvmesh_bridge_registrations_total", 0)),
            # each PublishEvents costs the bridge ~0.2 ms of CPU whatever it carries: below
            # capacity they go out nearly per engine batch, past it a few per loop turn
            "publishes_per_s": round(publishes / wall),
            "events_per_publish": (round(delta.get("kvmesh_bridge_events_published_total", 0)
                                         / publishes, 1) if publishes else None),
        }

    def close(self) -> None:
        for proc in (self.bridge, self.load):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.client.close()
        self.channel.close()
        self.probe.close(linger=0)
        self.service.stop()
        if self.redis is not None:
            self.redis.stop()
        self.tmp.cleanup()
        os.sched_setaffinity(0, self.cpus)


def _hist_ms(delta: dict[str, float], q: float) -> float | None:
    """The upper bound (ms) of the lag bucket holding the run's ``q`` quantile."""
    buckets = sorted((float(k.split("|")[1]), v) for k, v in delta.items()
                     if k.startswith("kvmesh_bridge_lag_seconds_bucket|"))
    total = buckets[-1][1] if buckets else 0
    for le, count in buckets:
        if total and count >= q * total:
            return le * 1e3
    return None


def run(rates: list[float], seconds: float = 10.0, engines: int = 8, blocks: int = 128,
        backend: str = "memory", uniform: bool = False, probes: float = 5.0,
        requests: int = 4, bulk_removals: bool = False,
        bridge_core: int | None = None) -> list[dict]:
    stack = Stack(engines, blocks, backend, uniform, requests, bulk_removals, bridge_core)
    try:
        return [{"backend": backend, "engines": engines, "blocks": blocks,
                 "requests": requests, "bulk_removals": bulk_removals,
                 "bridge_cpus": stack.bridge_cpus, **stack.measure(r, seconds, probes)}
                for r in rates]
    finally:
        stack.close()


def register(bench: typer.Typer) -> None:
    @bench.command("bridge")
    def bridge(rates: str = typer.Option("50000,100000,200000",
                                         help="offered stored blocks/s, comma-separated"),
               seconds: float = typer.Option(10.0, help="publishing time per rate"),
               engines: int = typer.Option(8, min=1, help="engines one bridge bridges"),
               blocks: int = typer.Option(128, min=1, help="blocks stored per batch (an "
                                          "engine step)"),
               requests: int = typer.Option(4, min=1, help="BlockStored events (requests) "
                                            "a batch's blocks are split over"),
               bulk_removals: bool = typer.Option(False, help="one BlockRemoved per batch "
                                                  "instead of one per block as vLLM emits"),
               backend: str = typer.Option("memory", help="the service's index: memory or "
                                           "redis (Valkey)"),
               uniform: bool = typer.Option(False, help="uniform token ids (default: Zipf, "
                                            "like text)"),
               probes: float = typer.Option(5.0, help="lag probes per second"),
               bridge_core: int = typer.Option(None, help="run the bridge alone on this CPU, "
                                               "everything else on the others (as a "
                                               "deployment gives it a core of its own)"),
               as_json: bool = typer.Option(False, "--json")) -> None:
        """One bridge process: blocks/s ingested across engines, publish-to-routable lag."""
        rows = run([float(r) for r in rates.split(",")], seconds, engines, blocks, backend,
                   uniform, probes, requests, bulk_removals, bridge_core)
        if as_json:
            for row in rows:
                print(json.dumps(row))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"one bridge, {engines} engines, {blocks}-block batches "
                            f"({requests} chains), {backend} index")
        cols = ("offered/s", "ingested/s", "per bridge CPU-s", "bridge CPU share",
                "us/block: loop+zmq+grpc+other",
                "lag p50 ms", "lag p99 ms", "bridge lag p50/p99 <= ms", "gaps", "clears",
                "lag clears (batches skipped)",
                "resyncs/sheds", "publishes/s (events each)", "silent+stale beats",
                "re-registrations")
        for col in cols:
            table.add_column(col, justify="right")
        for r in rows:
            table.add_row(f"{r['offered_blocks_per_s']:,.0f}", f"{r['ingest_blocks_per_s']:,}",
                          f"{r['blocks_per_bridge_cpu_s'] or 0:,}",
                          f"{r['bridge_cpu_s'] / r['wall_s']:.2f}",
                          f"{r['bridge_us_per_block']} = {r['loop_us_per_block']}+"
                          f"{r['zmq_us_per_block']}+{r['grpc_us_per_block']}+"
                          f"{r['other_us_per_block']}",
                          str(r["probe_lag_p50_ms"]), str(r["probe_lag_p99_ms"]),
                          f"{r['bridge_lag_p50_le_ms']}/{r['bridge_lag_p99_le_ms']}",
                          str(r["gaps"]), str(r["clears"]),
                          f"{r['lag_clears']} ({r['skipped_batches']})",
                          f"{r['resyncs']}/{r['sheds']}",
                          f"{r['publishes_per_s']} ({r['events_per_publish']})",
                          str(r["silent_beats"] + r["stale_beats"]), str(r["registrations"]))
        Console().print(table)
        best = max(rows, key=lambda r: r["ingest_blocks_per_s"])
        print(f"goal: {GOAL_BLOCKS_PER_S:,} blocks/s with p99 < {GOAL_P99_S * 1e3:.0f} ms; "
              f"best ingest {best['ingest_blocks_per_s']:,}/s (p99 "
              f"{best['probe_lag_p99_ms']} ms)")
