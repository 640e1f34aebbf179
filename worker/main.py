"""Run one worker process: engine thread + gRPC server + (optionally) the service link."""
from __future__ import annotations

import asyncio
import logging
import signal
import socket
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from kvmesh.contract import DEFAULT_ALGO
from kvmesh.rpc.tls import TlsFiles
from worker.kv_cache.tier_config import TierConfig

if TYPE_CHECKING:
    from kvmesh.events.zmq_curve import CurveServer

log = logging.getLogger("kvmesh.worker")


@dataclass
class WorkerOptions:
    """Everything ``serve`` reads; ``kvmesh worker`` maps its flags onto it.

    Clients authenticate to the worker with ``access_token``, this worker's own token
    (``kvmesh.rpc.auth.worker_access_token(router token, worker_id)``; valid on no other
    worker). Given only the router ``token``, the worker derives its own once its id is
    known (the id may be ``<hostname>-<port>``) and drops the router token
    (:func:`access_token_of`), so it never holds a credential of the service or of another
    worker.
    """

    port: int = 0
    host: str = "127.0.0.1"
    model: str = "tiny"
    block_size: int = 16
    num_blocks: int | None = None
    worker_id: str | None = None
    services: tuple[str, ...] = ()
    token: str | None = None          # router token (--token): only derives access_token
    access_token: str | None = None   # its own WorkerService token (--access-token)
    service_token: str | None = None  # what it presents to the service (--service-token)
    peer_fetch: bool = True           # serve peers' fetches and follow fetch plans
    hash_algo: str = DEFAULT_ALGO
    hash_seed: str | None = None      # None: kvmesh.hashing.resolve_seed's default (as vLLM)
    device: str | None = None
    heartbeat_s: float = 1.0
    max_batched_tokens: int = 2048
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"   # /metrics has no authentication: loopback unless told
    tls: TlsFiles | None = None       # cert/key: serve TLS; ca: verify the service (the link)
    max_inflight_per_conn: int = 1024
    max_message_bytes: int = 16 << 20
    tiers: TierConfig = TierConfig()  # KV tiers, eviction order, automatic pins
    # vLLM's protocols (none by default): KV events on ZMQ, an OpenAI HTTP server
    vllm_events: str | None = None    # PUB endpoint, e.g. tcp://127.0.0.1:5557
    vllm_replay: str | None = None    # replay ROUTER endpoint, e.g. tcp://127.0.0.1:5558
    vllm_hash_form: str = "int"       # block hashes as vLLM's int form, or "bytes"
    # CURVE for the event sockets (kvmesh.events.zmq_curve): needed for any non-loopback endpoint,
    # and whenever the worker has an access token
    vllm_curve_key: str | None = None      # its zmq.auth certificate, with the secret key
    vllm_curve_clients: str | None = None  # directory of the consumers' public certificates
    http_port: int | None = None      # OpenAI-compatible HTTP server (0: a free port)
    served_model_name: str | None = None  # the HTTP model name (default: model)
    tokenizer: str | None = None      # the HTTP API's tokenizer dir (default: the model's)
    lora_modules: dict[str, str] = field(default_factory=dict)  # HTTP model name -> path


def access_token_of(token: str | None, access_token: str | None,
                    worker_id: str) -> str | None:
    """The access token worker ``worker_id`` requires: ``access_token`` (its own, minted by
    ``kvmesh worker-access-token``), else the one derived from the router ``token`` and
    ``worker_id``, else None (open). Raises ``ValueError`` when both are given and disagree
    (a worker that no client of this router token could call: e.g. another worker's)."""
    from kvmesh.rpc.auth import worker_access_token

    derived = worker_access_token(token, worker_id) if token else None
    if access_token and derived and access_token != derived:
        raise ValueError(f"--access-token is not worker {worker_id!r}'s access token of "
                         "--token (it must be `kvmesh worker-access-token --worker-id "
                         f"{worker_id}`); give only one")
    return access_token or derived


def check_vllm(events: str | None, replay: str | None, hash_form: str, http_port: int | None,
               model: str, tokenizer: str | None, loras: list[str]) -> dict[str, str]:
    """Raise ``ValueError`` for vLLM-protocol flags that cannot work (before the model
    loads); returns the ``--lora-modules`` map. The event sockets' keys are checked by
    ``vllm_curve``."""
    from pathlib import Path

    from worker.vllm.publisher import HASH_FORMS

    if replay and not events:
        raise ValueError("--vllm-replay needs --vllm-events")
    if hash_form not in HASH_FORMS:
        raise ValueError(f"--vllm-hash-form must be one of {', '.join(HASH_FORMS)}")
    out: dict[str, str] = {}
    for item in loras:
        name, sep, path = item.partition("=")
        if not sep or not name or not path or out.get(name, path) != path:
            raise ValueError(f"--lora-modules {item!r}: expected NAME=PATH, one path per name")
        out[name] = path
    if loras and http_port is None:
        raise ValueError("--lora-modules names models of the HTTP API: give --http-port")
    source = tokenizer or (None if model == "tiny" else model)
    if http_port is not None and source not in (None, "tiny") and not (
            Path(source) / "tokenizer.json").is_file():
        raise ValueError(f"--http-port: no tokenizer.json in {source} (give --tokenizer)")
    return out


def vllm_curve(opts: WorkerOptions) -> CurveServer | None:
    """The CURVE identity of the event sockets (a ``kvmesh.events.zmq_curve.CurveServer``), or
    None for plain ZMQ; ``ValueError`` when the settings leave the events open to callers
    the worker's other APIs refuse: a non-loopback endpoint without keys
    (``worker.vllm.publisher.check_endpoints``), or a worker requiring an access token whose
    events any local process could read (they carry the prompts and salts the token guards).
    """
    from kvmesh.events.zmq_curve import CurveServer
    from worker.vllm.publisher import check_endpoints

    if not opts.vllm_events:
        return None
    if bool(opts.vllm_curve_key) != bool(opts.vllm_curve_clients):
        raise ValueError("--vllm-curve-key and --vllm-curve-clients go together")
    if opts.vllm_curve_key:
        return CurveServer.load(opts.vllm_curve_key, opts.vllm_curve_clients or "")
    check_endpoints(opts.vllm_events, opts.vllm_replay, None)
    if opts.access_token or opts.token:
        raise ValueError("--vllm-events: this worker requires an access token, but plain "
                         "ZMQ would hand every tenant's prompt ids and salts to any local "
                         "process; give --vllm-curve-key and --vllm-curve-clients "
                         "(KVMESH_VLLM_CURVE_KEY, KVMESH_VLLM_CURVE_CLIENTS; docs/vllm.md)")
    return None


async def serve(opts: WorkerOptions, stop: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set (or SIGINT/SIGTERM). Prints one ``listening on`` line
    once the server accepts calls; launchers wait for it."""
    from kvmesh.hashing import none_hash, resolve_seed
    from kvmesh.rpc.auth import worker_pin_token
    from kvmesh.rpc.channel import Dialer
    from worker.engine.async_engine import AsyncEngine
    from worker.engine.engine import Engine
    from worker.engine.scheduler import SchedulerConfig
    from worker.index_link import ServiceLink
    from worker.rpc.server import create_server

    curve = vllm_curve(opts)  # before the model loads (it reads --token/--access-token)
    router_token = opts.token  # only derives this worker's own access token; not kept
    opts = replace(opts, hash_seed=resolve_seed(opts.hash_algo, opts.hash_seed), token=None)
    if router_token and opts.worker_id:  # refused before the model loads
        opts = replace(opts, access_token=access_token_of(router_token, opts.access_token,
                                                          opts.worker_id))
        router_token = None
    tls = opts.tls
    # before the model loads: a certificate without a CA is refused here, not after start
    link_creds = tls.channel_credentials() if tls is not None and opts.services else None
    peers = Dialer.from_tls(tls if tls is not None and tls.dials_tls else None)
    engine = Engine.from_pretrained(
        opts.model, block_size=opts.block_size, num_blocks=opts.num_blocks, device=opts.device,
        hash_algo=opts.hash_algo, hash_seed=opts.hash_seed,
        scheduler=SchedulerConfig(max_batched_tokens=opts.max_batched_tokens),
        tiers=opts.tiers)
    runner = AsyncEngine(engine)
    publisher = None
    if opts.vllm_events:  # before the first step: its consumers get every event from seq 1
        from worker.engine.event_tap import EventTap
        from worker.vllm.publisher import VllmPublisher

        publisher = VllmPublisher(opts.vllm_events, opts.vllm_replay,
                                  block_size=opts.block_size, hash_form=opts.vllm_hash_form,
                                  curve=curve)
        publisher.start()
        EventTap.install(runner).add(publisher.deliver)
    runner.start()
    late_access: list[str | None] = [None]
    server, port, servicer = await create_server(
        f"{opts.host}:{opts.port}", runner, worker_id=opts.worker_id or "",
        model_name=opts.model,
        # an id known only once the port is bound: the token is derived just below, and
        # the server refuses every call until then (it is not started before either)
        access_token=(lambda: late_access[0]) if router_token else opts.access_token,
        pin_token=worker_pin_token(opts.service_token) if opts.service_token else None,
        credentials=tls.server_credentials() if tls is not None else None,
        max_inflight_per_conn=opts.max_inflight_per_conn,
        max_message_bytes=opts.max_message_bytes,
        # its peer key is that of the credential it presents to the service
        peer_fetch=opts.peer_fetch, credential=opts.service_token or "", dialer=peers)
    worker_id = opts.worker_id or f"{socket.gethostname()}-{port}"
    servicer.worker_id = worker_id  # known only once the port is bound (default host-port)
    if router_token:
        try:
            late_access[0] = access_token_of(router_token, opts.access_token, worker_id)
        except ValueError:
            await server.stop(None)
            await servicer.close_peers()
            if publisher is not None:
                await publisher.close()
            runner.stop()
            raise
        opts = replace(opts, access_token=late_access[0])
        router_token = None
    metrics_note = ""
    vllm_metrics = None
    if opts.http_port is not None:
        from worker.vllm.metrics import VllmMetrics

        vllm_metrics = VllmMetrics(runner, opts.served_model_name or opts.model)
    if opts.metrics_port is not None or vllm_metrics is not None:
        # one unauthenticated listener on --metrics-host for every page: the HTTP API's
        # vLLM page too (its prefix-cache hits are every caller's), on a free port when
        # --http-port is given without --metrics-port
        from worker.rpc.metrics import WorkerMetrics

        servicer.metrics = WorkerMetrics(runner, worker_id, servicer.tier_precision,
                                         servicer.peer)
        if vllm_metrics is not None:
            servicer.metrics.include(vllm_metrics.registry)
        mport = servicer.metrics.serve(opts.metrics_port or 0, opts.metrics_host)
        metrics_note = f", metrics on :{mport}"
    if opts.peer_fetch:  # before registering: the first load reports measured fetch costs
        from worker.rpc.fetch_calibration import calibrate

        await calibrate(servicer.peer_source, runner)
    await server.start()
    address = f"{opts.host}:{port}"
    http = None
    if opts.http_port is not None:
        http, http_port = await _start_http(opts, runner, vllm_metrics)
        metrics_note += f", HTTP on :{http_port}"
    if publisher is not None:
        events, replay = publisher.bound
        metrics_note += f", vLLM events on {events}" + (f" (replay {replay})" if replay else "")
    link = None
    tasks = []
    if opts.services:
        link = ServiceLink(list(opts.services), runner, worker_id=worker_id, address=address,
                           model=opts.model, token=opts.service_token,
                           heartbeat_s=opts.heartbeat_s,
                           root_hash=none_hash(opts.hash_algo, opts.hash_seed),
                           credentials=link_creds)
        tasks.append(asyncio.create_task(link.run()))
    tiers_note = "".join(f", {n} {tier} blocks" for tier, n in
                         (("cpu", opts.tiers.cpu_blocks), ("disk", opts.tiers.disk_blocks)) if n)
    print(f"kvmesh worker {worker_id} listening on {address} "
          f"({engine.kv.num_blocks} blocks of {opts.block_size}{tiers_note}{metrics_note})",
          flush=True)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread
            pass
    try:
        await stop.wait()
    finally:
        if http is not None:
            http[0].should_exit = True
            await http[1]
        if publisher is not None:
            await publisher.close()
        if link is not None:
            await link.close()
        for t in tasks:
            t.cancel()
        await server.stop(grace=1.0)
        await servicer.close_peers()  # the data plane goes with the server
        runner.stop()



async def _start_http(opts: WorkerOptions, runner, metrics) -> tuple[tuple, int]:
    """Serve the OpenAI HTTP API (``worker.vllm.http_api``; ``metrics``: the ``VllmMetrics`` it
    counts into, served by the metrics listener); ((server, task), bound port)."""
    from kvmesh.openai.tokenizer import TINY, VllmTokenizer
    from worker.vllm.http_api import HttpApi, serve_http

    source = opts.tokenizer or (None if opts.model == TINY else opts.model)
    api = HttpApi(runner, model_name=opts.served_model_name or opts.model,
                  tokenizer=VllmTokenizer.load(source), loras=opts.lora_modules,
                  access_token=opts.access_token, metrics=metrics)
    server, port, task = await serve_http(api, opts.host, opts.http_port or 0)
    return (server, task), port
