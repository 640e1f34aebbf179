"""`kvmesh worker`: run one worker process.

Each flag is written once, as a parameter of the command; :func:`options_of` turns the
parameters into ``worker.main.WorkerOptions`` by name (a flag named as a field passes as is;
the tier, TLS and ``--service`` flags are converted), so the defaults are those of
``WorkerOptions`` and ``TierConfig``, written there only.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Annotated, Any

import typer

from kvmesh.ops import cli_options as opt
from worker.kv_cache.tier_config import TierConfig
from worker.main import WorkerOptions

_DEFAULTS = WorkerOptions()
_TIERS = TierConfig()
_TIER_FLAGS = tuple(f.name for f in fields(TierConfig))
_TLS_FLAGS = ("tls_cert", "tls_key", "tls_ca", "tls_client_auth")  # tls_files' order


def register(app: typer.Typer) -> None:
    """Add the ``worker`` verb to ``app``."""

    @app.command("worker")
    def worker(
        port: Annotated[int, typer.Option(
            help="gRPC port (0: a free one, printed at start)")] = _DEFAULTS.port,
        host: Annotated[str, typer.Option(help="interface to bind and advertise")] = _DEFAULTS.host,
        model: Annotated[str, typer.Option(
            help="'tiny' (random weights) or a Hugging Face model directory")] = _DEFAULTS.model,
        block_size: Annotated[int, typer.Option(help="tokens per KV block")] = _DEFAULTS.block_size,
        num_blocks: Annotated[int | None, typer.Option(
            help="KV pool size (default: from memory)")] = None,
        worker_id: Annotated[str | None, typer.Option(
            help="default: <hostname>-<port>")] = None,
        service: opt.Service = None,
        token: opt.Token = None,
        access_token: opt.AccessToken = None,
        service_token: opt.ServiceToken = None,
        hash_algo: opt.HashAlgo = _DEFAULTS.hash_algo,
        hash_seed: opt.HashSeed = None,
        device: Annotated[str | None, typer.Option(
            help="cpu or cuda[:N] (default: cuda if present)")] = None,
        heartbeat_s: Annotated[float, typer.Option(
            help="heartbeat interval in seconds")] = _DEFAULTS.heartbeat_s,
        max_batched_tokens: Annotated[int, typer.Option(
            help="token budget per engine step")] = _DEFAULTS.max_batched_tokens,
        metrics_port: Annotated[int | None, typer.Option(
            help="serve Prometheus /metrics on this port (with --http-port, vLLM's names "
            "too; a free port when only --http-port is given)")] = None,
        metrics_host: Annotated[str, typer.Option(
            help="interface of /metrics (no authentication: loopback unless you mean "
            "it)")] = _DEFAULTS.metrics_host,
        tls_cert: opt.TlsCert = None,
        tls_key: opt.TlsKey = None,
        tls_ca: opt.TlsCa = None,
        tls_client_auth: opt.TlsClientAuth = False,
        max_inflight_per_conn: Annotated[int, typer.Option(
            help="calls in flight per client connection (0: unlimited)",
        )] = _DEFAULTS.max_inflight_per_conn,
        max_message_bytes: Annotated[int, typer.Option(
            help="largest request, bytes")] = _DEFAULTS.max_message_bytes,
        cpu_blocks: opt.CpuBlocks = _TIERS.cpu_blocks,
        disk_blocks: opt.DiskBlocks = _TIERS.disk_blocks,
        disk_dir: opt.DiskDir = _TIERS.disk_dir,
        eviction: opt.Eviction = _TIERS.eviction,
        auto_pin: opt.AutoPin = _TIERS.auto_pin,
        peer_fetch: Annotated[bool, typer.Option(
            "--peer-fetch/--no-peer-fetch",
            help="serve cached blocks to peers holding the service's ticket, and pull a "
            "routed request's planned prefix from its holder (off: refuse and ignore "
            "both)")] = _DEFAULTS.peer_fetch,
        vllm_events: Annotated[str | None, typer.Option(
            help="publish KV events on vLLM's ZMQ protocol at this PUB endpoint "
            "(tcp://127.0.0.1:5557; any other interface needs --vllm-curve-key), for kvmesh "
            "bridge vllm, llm-d or Dynamo")] = None,
        vllm_replay: Annotated[str | None, typer.Option(
            help="vLLM's replay ROUTER endpoint (tcp://127.0.0.1:5558): the last 10,000 "
            "batches, a bounded share per caller")] = None,
        vllm_curve_key: Annotated[str | None, typer.Option(
            envvar="KVMESH_VLLM_CURVE_KEY",
            help="CURVE for the event sockets: this worker's zmq.auth certificate with its "
            "secret key (NAME.key_secret); needed off loopback and with an access token")] = None,
        vllm_curve_clients: Annotated[str | None, typer.Option(
            envvar="KVMESH_VLLM_CURVE_CLIENTS",
            help="directory of the public certificates (*.key) of the consumers the event "
            "sockets let in (with --vllm-curve-key)")] = None,
        vllm_hash_form: Annotated[str, typer.Option(
            help="block hashes on the wire: 'int' (vLLM's default: the digest's low 8 "
            "bytes) or 'bytes' (the digest)")] = _DEFAULTS.vllm_hash_form,
        http_port: Annotated[int | None, typer.Option(
            help="serve vLLM's OpenAI API (/v1/completions, /v1/chat/completions) on this "
            "port (0: a free one); its /metrics in vLLM's names are on --metrics-host:"
            "--metrics-port, not here")] = None,
        served_model_name: Annotated[str | None, typer.Option(
            help="the model name of the HTTP API (default: --model)")] = None,
        tokenizer: Annotated[str | None, typer.Option(
            help="tokenizer directory of the HTTP API (default: the model's; 'tiny': bytes)",
        )] = None,
        lora_modules: Annotated[list[str] | None, typer.Option(
            help="NAME=PATH: an adapter the HTTP API serves as model NAME (repeatable)",
        )] = None,
    ) -> None:
        """Run one worker: KV pool + model + gRPC WorkerService (+ index registration)."""
        flags = dict(locals())  # first: exactly the parameters above, by name
        import asyncio
        import logging

        from worker.main import serve, vllm_curve

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        try:
            options = options_of(flags)
            vllm_curve(options)  # refused here, before the model loads
        except ValueError as e:
            raise typer.BadParameter(str(e)) from e
        asyncio.run(serve(options))


def options_of(flags: dict[str, Any]) -> WorkerOptions:
    """The ``WorkerOptions`` of ``kvmesh worker``'s parameters (``flags``, by name); raises
    ``ValueError`` for flags that cannot work, before the model loads. A parameter that is
    neither a field nor converted here is a ``TypeError``: every flag reaches the worker."""
    from kvmesh.hashing import resolve_seed
    from kvmesh.rpc.tls import tls_files
    from worker.main import access_token_of, check_vllm

    f = dict(flags)
    tiers = TierConfig(**{name: f.pop(name) for name in _TIER_FLAGS})
    tiers.check()
    tls = tls_files(*(f.pop(name) for name in _TLS_FLAGS))
    services = tuple(a.strip() for a in (f.pop("service") or "").split(",") if a.strip())
    f["hash_seed"] = resolve_seed(f["hash_algo"], f["hash_seed"])
    if f["token"] and f["worker_id"]:  # else serve() derives it once the port names the id
        f["access_token"] = access_token_of(f["token"], f["access_token"], f["worker_id"])
        f["token"] = None
    f["lora_modules"] = check_vllm(f["vllm_events"], f["vllm_replay"], f["vllm_hash_form"],
                                   f["http_port"], f["model"], f["tokenizer"],
                                   f["lora_modules"] or [])
    f["service_token"] = f["service_token"] or None
    return WorkerOptions(services=services, tls=tls, tiers=tiers, **f)
