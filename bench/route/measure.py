"""One `kvmesh bench route` run: start everything, measure, stop everything."""
from __future__ import annotations

import math
import os
import re
import statistics
import threading
import time
import urllib.request
from typing import Any

from bench.route.breakdown import breakdown
from bench.route.fleet import ALGO, BLOCK_SIZE, SIZES, ProtocolFleet, index_prompts, make_prompts
from deploy.ports import free_port


def _pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def _latencies(clients: dict[str, Any], prompts: dict[int, list[int]], routes: int,
               rounds: int, dry_run: bool) -> dict[str, dict[int, list[float]]]:
    """Seconds per ``client.route`` call, per client and size; sizes and clients interleaved
    round by round (the client order alternates) so all see the same machine load."""
    out: dict[str, dict[int, list[float]]] = {c: {n: [] for n in prompts} for c in clients}
    per = max(1, routes // rounds)
    names = list(clients)
    for k in range(rounds):
        for n, toks in prompts.items():
            for name in names if k % 2 == 0 else names[::-1]:
                client = clients[name]
                for _ in range(per):
                    t0 = time.perf_counter()
                    res = client.route(toks, dry_run=dry_run)
                    out[name][n].append(time.perf_counter() - t0)
                if dry_run and (miss := _short_of_chain(res, n, name)):
                    raise AssertionError(miss)
    return out


def _short_of_chain(res: Any, n: int, name: str) -> str:
    """Why a route of the ``n``-token prompt did not find its whole chain ("" if it did).
    The best match, not the chosen worker's: live routes add estimated load to the full
    holder, so a dry run may rightly rank a partial holder first."""
    got = {c.worker_id: c.matched_tokens for c in res.candidates}
    want = (n - 1) // BLOCK_SIZE * BLOCK_SIZE
    best = max(got.values(), default=0)
    return "" if best == want else (f"{n}-token route of client {name!r} matched {best} of "
                                    f"{want} (candidates {got})")


def _indexed(clients: dict[str, Any], prompts: dict[int, list[int]], deadline: float) -> None:
    """Wait until every client's dry route of every prompt finds its whole chain: the bench
    measures routes over an index that holds the prompts, in every replica. Raises (naming
    the client and every candidate's match) if one does not by ``deadline``."""
    for name, client in clients.items():
        for n, toks in prompts.items():
            while miss := _short_of_chain(client.route(toks, dry_run=True), n, name):
                if time.monotonic() > deadline:
                    raise AssertionError(miss)
                time.sleep(0.1)


def cpu_seconds(pid: int | None) -> float:
    """CPU time (user + system, every thread) process ``pid`` has used so far, from
    ``/proc/PID/stat``; NaN where that cannot be read (not Linux, gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def redis_cpu_seconds(info: Any) -> float:
    """CPU time the Redis server has used so far (``INFO cpu``: microsecond resolution,
    where ``/proc`` counts 10 ms ticks); ``info`` is a redis-py client."""
    cpu = info.info("cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


def _throughput(client: Any, toks: list[int], threads: int, duration_s: float,
                pids: dict[str, int | None], redis_info: Any) -> dict[str, float]:
    """Dry-run routes (``routes``) in ``wall_s`` seconds with ``threads`` threads sharing
    ``client``, and the CPU seconds each process of ``pids`` (``client``: this process;
    ``redis``: the server behind ``redis_info``) spent meanwhile."""
    counts = [0] * threads
    stop = time.perf_counter() + duration_s

    def loop(k: int) -> None:
        while time.perf_counter() < stop:
            client.route(toks, dry_run=True)
            counts[k] += 1

    cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
    redis0 = redis_cpu_seconds(redis_info)
    own0 = time.process_time()
    t0 = time.perf_counter()
    pool = [threading.Thread(target=loop, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out = {"routes": float(sum(counts)), "wall_s": time.perf_counter() - t0,
           "client": time.process_time() - own0}
    out.update({name: cpu_seconds(pid) - cpu0[name] for name, pid in pids.items()})
    out["redis"] = redis_cpu_seconds(redis_info) - redis0
    return out


def _rates(runs: list[dict[str, float]]) -> dict[str, float]:
    """Routes/s and CPU ms per route (``cpu_ms_<process>``) over the runs of
    :func:`_throughput` of one replica and size."""
    total = {k: sum(r[k] for r in runs) for k in runs[0]}
    n = max(total.pop("routes"), 1.0)
    wall = total.pop("wall_s")
    return {"routes_per_s": n / wall, **{f"cpu_ms_{k}": v / n * 1e3 for k, v in total.items()}}


def _handler_seconds(metrics_port: int) -> tuple[float, float]:
    """(sum, count) of the service's ``kvmesh_route_latency_seconds`` histogram."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    found = dict(re.findall(r"^kvmesh_route_latency_seconds_(sum|count) (\S+)$", text, re.M))
    return float(found.get("sum", 0.0)), float(found.get("count", 0.0))


def _stats(lat: list[float], base: list[float]) -> dict[str, float]:
    return {"p50_ms": statistics.median(lat) * 1e3, "p99_ms": _pct(lat, 0.99) * 1e3,
            "ratio_p50": statistics.median(lat) / statistics.median(base)}


def _group(variant: str) -> str:
    """Which Redis (and protocol fleet) a variant's replica uses: the baseline its own."""
    return "_base" if variant == "_base" else ""


def run(workers: int = 8, routes: int = 400, rounds: int = 4, threads: int = 4,
        duration_s: float = 2.0, sizes: tuple[int, ...] = SIZES, seed: int = 0,
        baseline: str | None = None) -> dict:
    """Start Valkey, two service replicas over it (the service as shipped, and the same with
    its block-hash memo off), the protocol fleet; measure both side by side; stop all.
    ``baseline``: the root of another source tree (an earlier commit's checkout); a third
    replica runs that tree's service, and its client sends prompts in the old repeated
    ``token_ids`` field (what clients of that tree sent): before and after in one run.

    Returns the setup and ``sizes``: per size ``tokens``, ``blocks``, then for the shipped
    service ``p50_ms``, ``p99_ms``, ``ratio_p50`` (over the smallest size), ``p50_ms_live`` /
    ``p99_ms_live`` (without dry_run), ``routes_per_s``, ``handler_ms``, ``cpu_ms_service``
    (the service process's CPU per route over the routes/s run: gRPC, handler, Redis
    client, all of it), ``cpu_ms_redis`` (``INFO cpu``) and ``cpu_ms_client`` (this
    process) over the same run; the same keys suffixed ``_nomemo`` for the memo-less
    replica (and ``_base`` for the baseline's); and the breakdown ``*_us``.
    """
    import redis as redis_py

    from client import KvmeshClient
    from deploy.process import ServerProcess
    from deploy.redis_server import start_redis

    # result-key suffix -> (MEMO argument of serve, extra environment, packed prompts)
    variants: dict[str, tuple[str, dict[str, str], bool]] = {"": ("1", {}, True),
                                                             "_nomemo": ("0", {}, True)}
    if baseline:
        # PYTHONSAFEPATH: `python -m` would put the working directory (this tree) first
        variants["_base"] = ("1", {"PYTHONPATH": os.path.abspath(baseline),
                                   "PYTHONSAFEPATH": "1"}, False)
    ports = {v: free_port() for v in variants}
    # The baseline's index layout may differ from this tree's: it gets its own Redis and its
    # own protocol fleet, indexed with the same prompts.
    redises = {g: start_redis() for g in {_group(v) for v in variants}}
    redis = redises[""]
    services = {v: ServerProcess(f"service{v}", "bench.route.serve", [str(ports[v]), memo],
                                 env={"KVMESH_REDIS_URL": redises[_group(v)].url, **env})
                for v, (memo, env, _) in variants.items()}
    fleets: dict[str, ProtocolFleet] = {}
    clients: dict[str, Any] = {}
    try:
        for svc in services.values():
            svc.start(60)
        prompts = make_prompts(sizes, seed)
        for g in redises:
            fleets[g] = ProtocolFleet(str(services[g].address), workers).start()
            indexed = index_prompts(fleets[g], prompts)
            if g == "":
                fleet, chains = fleets[g], indexed
        clients = {v: KvmeshClient(str(svc.address), packed_tokens=variants[v][2])
                   for v, svc in services.items()}
        deadline = time.monotonic() + 10
        for client in clients.values():  # the other replica sees the fleet through Redis
            while sum(w["alive"] for w in client.stats()["workers"]) < workers:
                if time.monotonic() > deadline:
                    raise RuntimeError("protocol workers did not become live")
                time.sleep(0.1)
        _indexed(clients, prompts, deadline=time.monotonic() + 10)
        _latencies(clients, prompts, 10 * len(sizes), 1, dry_run=True)  # warm up
        dry: dict[str, dict[int, list[float]]] = {v: {n: [] for n in sizes} for v in variants}
        handler: dict[str, dict[int, float]] = {v: {} for v in variants}
        for v, client in clients.items():
            h0 = _handler_seconds(ports[v])
            for n in sizes:  # the handler histogram has no size label: one size at a time
                lat = _latencies({v: client}, {n: prompts[n]}, routes // 4, 1, dry_run=True)
                h1 = _handler_seconds(ports[v])
                handler[v][n] = (h1[0] - h0[0]) / max(h1[1] - h0[1], 1) * 1e3
                h0 = h1
                dry[v][n] += lat[v][n]
        for v, per_size in _latencies(clients, prompts, routes, rounds, True).items():
            for n, lat in per_size.items():
                dry[v][n] += lat
        live = _latencies({"": clients[""]}, prompts, routes // 2, rounds, False)[""]
        runs: dict[str, dict[int, list[dict[str, float]]]] = {
            v: {n: [] for n in sizes} for v in variants}
        # slices of about half a second, replicas in turn (the order alternating), so that
        # a busy moment of the machine hits every replica alike
        slices = max(2, round(duration_s / 0.5))
        infos = {g: redis_py.Redis.from_url(r.url) for g, r in redises.items()}
        for k in range(slices):
            for n in sizes:
                for v in list(clients) if k % 2 == 0 else list(clients)[::-1]:
                    runs[v][n].append(_throughput(
                        clients[v], prompts[n], threads, duration_s / slices,
                        {"service": services[v].pid}, infos[_group(v)]))
        for info in infos.values():
            info.close()
        rps = {v: {n: _rates(runs[v][n]) for n in sizes} for v in variants}
        parts = breakdown(prompts, chains, redis.url, fleet.ids, repeats=50)
    finally:
        for client in clients.values():
            client.close()
        for f in fleets.values():
            f.stop()
        for svc in services.values():
            svc.stop(5)
        for r in redises.values():
            r.stop()
    rows = []
    for n in sizes:
        row: dict[str, Any] = {"tokens": n, "blocks": n // BLOCK_SIZE}
        for v in variants:
            row.update({k + v: x for k, x in _stats(dry[v][n], dry[v][sizes[0]]).items()})
            row.update({k + v: x for k, x in rps[v][n].items()})
            row["handler_ms" + v] = handler[v][n]
        row["p50_ms_live"] = statistics.median(live[n]) * 1e3
        row["p99_ms_live"] = _pct(live[n], 0.99) * 1e3
        rows.append({**row, **parts[n]})
    return {"workers": workers, "threads": threads,
            "routes_per_size": len(dry[""][sizes[0]]), "block_size": BLOCK_SIZE,
            "algo": ALGO, "sizes": rows, "goal_ratio_8k": 1.5, "goal_own_cpu_ms": 0.5,
            "goal_rps_gain": 3.0, "baseline": baseline}
