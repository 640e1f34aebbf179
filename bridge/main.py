"""One bridge process: every engine rank it bridges, on one event loop.

Per rank: an ``EngineState`` (this bridge's hash algorithm and seed, the engine's LoRA map),
a ``Subscriber`` reading the rank's events into it, an ``EngineLink`` publishing what the
state emits and heartbeating the load a ``LoadSource`` scrapes (ranks sharing a ``/metrics``
URL share one ``Scraper``). ``serve`` runs them until ``stop`` is set or SIGINT/SIGTERM.
The links heartbeat (and scrape) from one ``BeatThread``, apart from the ingest loop, so
that a bridge past capacity keeps its engines live (``kvmesh.link.link`` has the contract).
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
from collections.abc import Iterator
from dataclasses import dataclass

from bridge.config import EngineSpec, RankSpec, check_unique, ranks
from bridge.engine_load import LoadSource, Scraper
from bridge.engine_state import EngineState
from bridge.link import EngineLink
from bridge.metrics import BridgeMetrics
from bridge.subscriber import Subscriber
from bridge.supervisor import supervise
from kvmesh.contract import DEFAULT_ALGO
from kvmesh.events.zmq_curve import CurveClient
from kvmesh.hashing import none_hash, resolve_seed
from kvmesh.link.beat_thread import BeatThread
from kvmesh.rpc.tls import TlsFiles


@dataclass(frozen=True)
class BridgeOptions:
    services: tuple[str, ...]
    service_token: str | None = None  # the worker credential it presents to the service
    hash_algo: str = DEFAULT_ALGO
    hash_seed: str | None = None      # None: resolve_seed's rule (PYTHONHASHSEED, default)
    tls: TlsFiles | None = None       # ca: verify the service; cert/key: mutual TLS
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    heartbeat_s: float = 1.0          # until the service answers its own interval
    metrics_timeout_s: float = 1.0    # an engine's /metrics slower than this is silent
    replay_timeout_s: float = 5.0
    probe_interval_s: float | None = 10.0
    curve_key: str | None = None      # its zmq.auth certificate, for engines' CURVE sockets


@dataclass
class Rank:
    spec: RankSpec
    state: EngineState
    sub: Subscriber
    link: EngineLink

    @property
    def worker_id(self) -> str:
        return self.spec.worker_id


def build(opts: BridgeOptions, engines: list[EngineSpec]) -> list[Rank]:
    """The ranks of ``engines`` (call inside the loop that will run them). Raises
    ``ValueError`` for bad settings (duplicate ids, TLS files, an xxhash algo without seed)."""
    check_unique(engines)
    seed = resolve_seed(opts.hash_algo, opts.hash_seed)
    root = none_hash(opts.hash_algo, seed)
    creds = opts.tls.channel_credentials() if opts.tls is not None else None
    scrapers: dict[str, Scraper] = {}
    out = []
    for spec in engines:
        curve = None
        if spec.curve_server_key is not None:  # the engine's event sockets are CURVE servers
            if not opts.curve_key:
                raise ValueError(f"{spec.worker_id}: curve-server-key needs --curve-key")
            curve = CurveClient.load(opts.curve_key, spec.curve_server_key)
        for r in ranks(spec):
            scraper = scrapers.setdefault(
                r.metrics_url, Scraper(r.metrics_url, timeout=opts.metrics_timeout_s))
            state = EngineState(block_size=spec.block_size, algo=opts.hash_algo, seed=seed,
                                loras=spec.lora, wire=True)  # events as the link sends them
            link = EngineLink(
                list(opts.services), state,
                LoadSource(scraper, r.rank, num_blocks=spec.num_blocks,
                           block_size=spec.block_size),
                worker_id=r.worker_id, address=r.address, model=spec.model, root_hash=root,
                token=r.service_token or opts.service_token, credentials=creds,
                heartbeat_s=opts.heartbeat_s)
            sub = Subscriber(state, r.events, r.replay, link.on_events,
                             topic=spec.topic.encode(), replay_timeout=opts.replay_timeout_s,
                             probe_interval=opts.probe_interval_s, name=r.worker_id,
                             max_lag_s=lambda link=link: link.liveness_s / 2, curve=curve)
            out.append(Rank(r, state, sub, link))
    return out


# Allocations between young-generation collections while serving (CPython's default: 700).
GC_YOUNG = 50_000


@contextlib.contextmanager
def quiet_gc(young: int = GC_YOUNG) -> Iterator[None]:
    """The cyclic collector tuned for the ingest loop, restored on the way out.

    Why: every engine batch allocates and drops dozens of containers (decoded events,
    lists, tuples), and nearly none is part of a cycle; at the default threshold young
    collections ran every few batches and full ones traversed every object the process has
    (modules, gRPC, ZMQ, the fleet): about 2% of the bridge's CPU at capacity (measured
    with ``gc.callbacks``; under 0.1% tuned). Here what exists once the fleet is built is
    frozen (never traversed again; it lives as long as the process) and young collections
    wait for ``young`` allocations. Cycles are still collected, only less often."""
    old = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(young, old[1], old[2])
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


async def serve(opts: BridgeOptions, engines: list[EngineSpec],
                stop: asyncio.Event | None = None) -> None:
    """Bridge ``engines`` until ``stop`` is set (or SIGINT/SIGTERM), with the collector
    tuned (``quiet_gc``)."""
    fleet = build(opts, engines)
    with quiet_gc():
        await run(fleet, opts, stop)


async def run(fleet: list[Rank], opts: BridgeOptions, stop: asyncio.Event | None = None) -> None:
    """Run built ranks until ``stop`` is set (or SIGINT/SIGTERM); prints one line naming the
    workers once everything runs. Subscribers are supervised (``bridge.supervisor``: one
    that fails restarts, its engine cleared meanwhile); another task that ends by itself (a
    crash) is raised here."""
    metrics = BridgeMetrics(fleet)
    beats = BeatThread().start()
    for r in fleet:
        metrics.watch(r.link)
        r.link.beats = beats
    note = ""
    if opts.metrics_port is not None:
        note = f", metrics on :{metrics.serve(opts.metrics_port, opts.metrics_host)}"
    tasks = [asyncio.create_task(t) for r in fleet  # a failed subscriber restarts alone
             for t in (supervise(r.sub, r.worker_id), r.link.run())]
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    handled = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(sig, stop.set)
            handled.append(sig)
    print(f"kvmesh bridge: {len(fleet)} worker(s) {', '.join(r.worker_id for r in fleet)} "
          f"-> {','.join(opts.services)}{note}", flush=True)
    waiter = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            if t is not waiter:
                t.result()  # a task that ended on its own crashed: surface it
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
        waiter.cancel()
        for r in fleet:
            await r.link.close()
        metrics.close()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.to_thread(beats.stop)
