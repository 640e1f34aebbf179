"""The ``kvmesh gateway`` command: flags -> ``GatewayConfig`` -> uvicorn.

At start it says once how callers are isolated and what to change (``client.gateway.notice``).

Bad flags (unreadable tenant keys, a model directory without ``tokenizer.json``) print one
``error: ...`` line and exit 2 before anything listens.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from client.gateway.limits import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_MAX_TOTAL,
    DEFAULT_MAX_WAIT_S,
)
from client.gateway.tokenizer import TINY, TINY_CONTEXT
from kvmesh.ops.cli_options import DEFAULT_SERVICE, Service, TlsCa, TlsCert, TlsKey, Token

if TYPE_CHECKING:
    from client.gateway.app import GatewayConfig
    from kvmesh.rpc.tls import TlsFiles


def _has_chat_template(model_dir: Path) -> bool:
    try:
        config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("chat_template"))


def model_context(source: str) -> int | None:
    """The context length of ``tiny`` or of a model directory, as its worker reads it
    (``max_position_embeddings`` in ``config.json``, 2048 when absent); None for a directory
    without a readable ``config.json`` (a tokenizer-only copy)."""
    if source == TINY:
        return TINY_CONTEXT
    try:
        config = json.loads((Path(source) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    text = config.get("text_config", config) if isinstance(config, dict) else {}
    return int(text.get("max_position_embeddings", config.get("max_position_embeddings",
                                                                 2048)))


def parse_loras(items: list[str] | None) -> dict[str, str]:
    """``NAME=PATH`` flags as ``{name: path}``; ``ValueError`` for anything else."""
    out: dict[str, str] = {}
    for item in items or ():
        name, sep, path = item.partition("=")
        if not sep or not name or not path or out.get(name, path) != path:
            raise ValueError(f"--lora {item!r}: expected NAME=PATH, one path per name")
        out[name] = path
    return out


def build_config(service: str, model: str = TINY, model_dir: Path | None = None,
                 served_model_name: str | None = None, token: str | None = None,
                 tenant_keys: Path | None = None, salt_secret: str | None = None,
                 generate_timeout: float = 120.0, tls: TlsFiles | None = None, *,
                 shared_cache: bool = False, max_model_len: int | None = None,
                 limits: dict[str, float] | None = None, tokenizer_dir: Path | None = None,
                 loras: dict[str, str] | None = None,
                 engine_api_key: str | None = None, engine_allow: list[str] | None = None,
                 engine_keys: Path | None = None,
                 metrics_key: str | None = None,
                 tenant_weights: list[str] | None = None) -> GatewayConfig:
    """The gateway's configuration from its flags.

    The model is ``model_dir`` if given, else ``model`` (``tiny`` or a directory); it is
    served under ``served_model_name``, else ``tiny`` or the directory's name; ``tls`` is
    the client side of TLS to the kvmesh service and workers (its files are read here).
    ``max_model_len`` defaults to the model's own context; ``limits`` holds the other
    ``GatewayConfig`` limits by field name. ``tokenizer_dir`` (``--tokenizer``) tokenizes as
    vLLM does, chat template included (``kvmesh.openai.tokenizer``), and is the model's
    directory for the name and context when no model is given. ``engine_allow`` (addresses,
    with ``engine_api_key``) and ``engine_keys`` (a file of per-engine keys) list the HTTP
    engines requests may be forwarded to (``client.gateway.engines``); ``metrics_key`` opens
    ``GET /metrics`` on the API port; ``tenant_weights`` (``--tenant-weights a=2,b=1``) are
    the fair shares of ``--max-concurrent`` (``client.gateway.fair_slots``). Raises
    ``ValueError`` (or ``OSError``) with a readable message for bad flags.
    """
    from client.gateway.app import GatewayConfig
    from client.gateway.engines import EngineList
    from client.gateway.fair_slots import parse_weights
    from client.gateway.tenants import Tenancy
    from client.gateway.tokenizer import load_tokenizer
    from kvmesh.rpc.channel import parse_addresses

    addresses = parse_addresses(service)
    if tls is not None:
        tls.channel_credentials()  # unreadable files: a flag error now, not on a request
    if tokenizer_dir is not None and model_dir is None and model == TINY:
        model_dir = tokenizer_dir  # the model is the tokenizer's
    source = str(model_dir) if model_dir is not None else model
    if tokenizer_dir is not None:
        from kvmesh.openai.tokenizer import VllmTokenizer

        tokenizer = VllmTokenizer.load(tokenizer_dir)
    else:
        tokenizer = load_tokenizer(source)
    name = served_model_name or (TINY if source == TINY else Path(source).resolve().name)
    if tokenizer_dir is None and source != TINY and _has_chat_template(Path(source)):
        typer.echo("note: the model's own chat_template is not rendered; chat requests use the "
                   "gateway's simple template (<|role|> lines)", err=True)
    tenancy = Tenancy.from_file(tenant_keys, salt_secret) if tenant_keys is not None else None
    if tenancy is not None and tenancy.random_secret:
        typer.echo("warning: no --salt-secret (KVMESH_GATEWAY_SECRET): tenant salts are random "
                   "for this process, so they change on restart and differ between gateway "
                   "replicas", err=True)
    weights = parse_weights(tenant_weights)
    unknown = sorted(set(weights) - (tenancy.tenants if tenancy is not None else set()))
    if unknown:
        typer.echo(f"warning: --tenant-weights names {', '.join(unknown)}, which no API key "
                   "of --tenant-keys maps to: those weights never apply (without tenant keys "
                   "every request is the tenant 'default')", err=True)
    engines = EngineList.build(engine_allow or (), engine_api_key, engine_keys)
    if engine_api_key and not engines:
        typer.echo("warning: --engine-api-key but no --engine-allow or --engine-keys: no HTTP "
                   "engine is listed, so the key is sent nowhere and HTTP engines are never "
                   "forwarded to", err=True)
    context = max_model_len if max_model_len is not None else model_context(source)
    if context is None:
        raise ValueError(f"{source} has no readable config.json to take the model's context "
                         "length from: give --max-model-len")
    return GatewayConfig(service=addresses, model_name=name, tokenizer=tokenizer, token=token,
                         tenancy=tenancy, generate_timeout=generate_timeout, tls=tls,
                         shared_cache=shared_cache, max_model_len=context,
                         loras=dict(loras or {}), engines=engines, tenant_weights=weights,
                         metrics_key=metrics_key or None, **(limits or {}))


def gateway_cmd(
    service: Service = DEFAULT_SERVICE,
    port: Annotated[int, typer.Option("--port", help="HTTP port.")] = 8000,
    host: Annotated[str, typer.Option("--host", help="HTTP bind address.")] = "127.0.0.1",
    model: Annotated[str, typer.Option(
        "--model", help="'tiny' (byte-level tokens) or a model directory.")] = TINY,
    model_dir: Annotated[Path | None, typer.Option(
        "--model-dir", help="Model directory with tokenizer.json (overrides --model).")] = None,
    served_model_name: Annotated[str | None, typer.Option(
        "--served-model-name", help="Model name clients send (default: tiny or the "
        "directory's name).")] = None,
    token: Token = None,
    tenant_keys: Annotated[Path | None, typer.Option(
        "--tenant-keys", help="API keys -> tenants (JSON object or '<key> <tenant>' lines); "
        "turns on API-key auth and per-tenant salts.")] = None,
    salt_secret: Annotated[str | None, typer.Option(
        "--salt-secret", envvar="KVMESH_GATEWAY_SECRET",
        help="Secret the tenant salts are derived with; share it between gateway "
        "replicas.")] = None,
    generate_timeout: Annotated[float, typer.Option(
        "--generate-timeout", help="Seconds one generation may take on one worker.")] = 120.0,
    insecure_shared_cache: Annotated[bool, typer.Option(
        "--insecure-shared-cache", help="Without --tenant-keys, let requests without "
        "cache_salt share one cache (default: each gets a random salt). Anyone can then "
        "probe others' prompts by timing.")] = False,
    max_model_len: Annotated[int | None, typer.Option(
        "--max-model-len", help="Prompt + max_tokens limit (default: the model's "
        "context).")] = None,
    max_body_bytes: Annotated[int, typer.Option(
        "--max-body-bytes", help="Largest request body (413 above).")] = DEFAULT_MAX_BODY_BYTES,
    max_batch_prompts: Annotated[int, typer.Option(
        "--max-batch-prompts",
        help="Most prompts in one completions request.")] = DEFAULT_MAX_BATCH,
    max_concurrent: Annotated[int, typer.Option(
        "--max-concurrent-per-tenant", help="Prompts one tenant (API key's tenant, else "
        "client IP) may have generating or waiting at once (429 above).")
    ] = DEFAULT_MAX_CONCURRENT,
    max_total: Annotated[int, typer.Option(
        "--max-concurrent", help="Prompts the gateway admits at once, all tenants together "
        "(0: no bound). Over it, requests wait and the next free slot goes to tenants in "
        "weighted fair shares (--tenant-weights).")] = DEFAULT_MAX_TOTAL,
    tenant_weights: Annotated[list[str] | None, typer.Option(
        "--tenant-weights", help="TENANT=WEIGHT[,...] (repeatable): the tenants' shares of "
        "--max-concurrent while they wait (default weight 1; a=2,b=1: a gets twice b's "
        "slots).")] = None,
    max_wait_s: Annotated[float, typer.Option(
        "--max-queue-wait", help="Seconds a request may wait for a slot under "
        "--max-concurrent (then 503 with Retry-After).")] = DEFAULT_MAX_WAIT_S,
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn log level.")] = "info",
    tls_ca: TlsCa = None, tls_cert: TlsCert = None, tls_key: TlsKey = None,
    tokenizer: Annotated[Path | None, typer.Option(
        "--tokenizer", help="Tokenize as vLLM does with this directory's tokenizer.json and "
        "chat template (for vLLM engines; the model's directory when no model is "
        "given).")] = None,
    lora: Annotated[list[str] | None, typer.Option(
        "--lora", help="NAME=PATH: requests for model NAME route and run under this LoRA "
        "adapter (the bridge's --lora map; repeatable).")] = None,
    engine_api_key: Annotated[str | None, typer.Option(
        "--engine-api-key", envvar="KVMESH_ENGINE_API_KEY",
        help="Bearer key the gateway presents to the HTTP engines of --engine-allow (and of "
        "--engine-keys entries without a key of their own; vLLM's --api-key); callers' keys "
        "never reach engines.")] = None,
    engine_allow: Annotated[list[str] | None, typer.Option(
        "--engine-allow", envvar="KVMESH_ENGINE_ALLOW",
        help="http(s)://HOST:PORT of an HTTP engine requests may be forwarded to (repeatable "
        "or comma-separated; the addresses of the bridge's engines). No other address a "
        "worker registers is ever contacted.")] = None,
    engine_keys: Annotated[Path | None, typer.Option(
        "--engine-keys", help="File of HTTP engines and their own keys ('<address> [<key>]' "
        "lines or a JSON object address -> key); each key goes only to its address.")] = None,
    metrics_key: Annotated[str | None, typer.Option(
        "--metrics-key", envvar="KVMESH_GATEWAY_METRICS_KEY",
        help="Bearer key that opens GET /metrics on the API port (no tenant key does; "
        "without it the API port serves no metrics).")] = None,
    metrics_port: Annotated[int | None, typer.Option(
        "--metrics-port", help="Serve Prometheus /metrics on a listener of its own (no "
        "authentication) on this port.")] = None,
    metrics_host: Annotated[str, typer.Option(
        "--metrics-host", help="Interface of --metrics-port (no authentication: loopback "
        "unless you mean it).")] = "127.0.0.1",
) -> None:
    """Serve an OpenAI-compatible API (completions, chat, streaming) routed by kvmesh."""
    try:
        from kvmesh.rpc.tls import tls_files

        config = build_config(service, model, model_dir, served_model_name, token,
                              tenant_keys, salt_secret, generate_timeout,
                              tls_files(tls_cert, tls_key, tls_ca),
                              shared_cache=insecure_shared_cache, max_model_len=max_model_len,
                              limits={"max_body_bytes": max_body_bytes,
                                      "max_batch_prompts": max_batch_prompts,
                                      "max_concurrent": max_concurrent,
                                      "max_total": max_total, "max_wait_s": max_wait_s},
                              tokenizer_dir=tokenizer, loras=parse_loras(lora),
                              engine_api_key=engine_api_key, engine_allow=engine_allow,
                              engine_keys=engine_keys, metrics_key=metrics_key,
                              tenant_weights=tenant_weights)
    except (OSError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    import uvicorn

    from client.gateway.app import create_app
    from client.gateway.notice import startup_notice

    app = create_app(config)
    typer.echo(startup_notice(config), err=True)  # once: how callers are isolated, and why
    if metrics_port is not None:
        try:
            bound = app.state.gateway.metrics.serve(metrics_port, metrics_host)
        except OSError as exc:
            typer.echo(f"error: --metrics-port {metrics_port}: {exc}", err=True)
            raise typer.Exit(2) from None
        typer.echo(f"kvmesh gateway metrics on {metrics_host}:{bound}", err=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level)


def register(app: typer.Typer) -> None:
    """Add the ``gateway`` verb to ``app``."""
    app.command("gateway")(gateway_cmd)
