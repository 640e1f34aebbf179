"""The ``kvmesh gateway`` command: flags -> ``GatewayConfig`` -> uvicorn.

Bad flags (unreadable tenant keys, a model directory without ``tokenizer.json``) print one
``error: ...`` line and exit 2 before anything listens.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from client.gateway.tokenizer import TINY

if TYPE_CHECKING:
    from client.gateway.app import GatewayConfig
    from kvmesh.tls import TlsFiles


def _has_chat_template(model_dir: Path) -> bool:
    try:
        config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("chat_template"))


def build_config(service: str, model: str = TINY, model_dir: Path | None = None,
                 served_model_name: str | None = None, token: str | None = None,
                 tenant_keys: Path | None = None, salt_secret: str | None = None,
                 generate_timeout: float = 120.0, tls: TlsFiles | None = None) -> GatewayConfig:
    """The gateway's configuration from its flags.

    The model is ``model_dir`` if given, else ``model`` (``tiny`` or a directory); it is
    served under ``served_model_name``, else ``tiny`` or the directory's name; ``tls`` is
    the client side of TLS to the kvmesh service and workers (its files are read here). Raises
    ``ValueError`` (or ``OSError``) with a readable message for bad flags.
    """
    from client.failover import parse_addresses
    from client.gateway.app import GatewayConfig
    from client.gateway.tenants import Tenancy
    from client.gateway.tokenizer import load_tokenizer

    addresses = parse_addresses(service)
    if tls is not None:
        tls.channel_credentials()  # unreadable files: a flag error now, not on a request
    source = str(model_dir) if model_dir is not None else model
    tokenizer = load_tokenizer(source)
    name = served_model_name or (TINY if source == TINY else Path(source).resolve().name)
    if source != TINY and _has_chat_template(Path(source)):
        typer.echo("note: the model's own chat_template is not rendered; chat requests use the "
                   "gateway's simple template (<|role|> lines)", err=True)
    tenancy = Tenancy.from_file(tenant_keys, salt_secret) if tenant_keys is not None else None
    if tenancy is not None and tenancy.random_secret:
        typer.echo("warning: no --salt-secret (KVMESH_GATEWAY_SECRET): tenant salts are random "
                   "for this process, so they change on restart and differ between gateway "
                   "replicas", err=True)
    return GatewayConfig(service=addresses, model_name=name, tokenizer=tokenizer, token=token,
                         tenancy=tenancy, generate_timeout=generate_timeout, tls=tls)


def gateway_cmd(
    service: Annotated[str, typer.Option(
        "--service", envvar="KVMESH_SERVICE",
        help="Metadata service replica(s): HOST:PORT[,HOST:PORT]")] = "127.0.0.1:50051",
    port: Annotated[int, typer.Option("--port", help="HTTP port.")] = 8000,
    host: Annotated[str, typer.Option("--host", help="HTTP bind address.")] = "127.0.0.1",
    model: Annotated[str, typer.Option(
        "--model", help="'tiny' (byte-level tokens) or a model directory.")] = TINY,
    model_dir: Annotated[Path | None, typer.Option(
        "--model-dir", help="Model directory with tokenizer.json (overrides --model).")] = None,
    served_model_name: Annotated[str | None, typer.Option(
        "--served-model-name", help="Model name clients send (default: tiny or the "
        "directory's name).")] = None,
    token: Annotated[str | None, typer.Option(
        "--token", envvar="KVMESH_TOKEN",
        help="Bearer token for the kvmesh service and workers.")] = None,
    tenant_keys: Annotated[Path | None, typer.Option(
        "--tenant-keys", help="API keys -> tenants (JSON object or '<key> <tenant>' lines); "
        "turns on API-key auth and per-tenant salts.")] = None,
    salt_secret: Annotated[str | None, typer.Option(
        "--salt-secret", envvar="KVMESH_GATEWAY_SECRET",
        help="Secret the tenant salts are derived with; share it between gateway "
        "replicas.")] = None,
    generate_timeout: Annotated[float, typer.Option(
        "--generate-timeout", help="Seconds one generation may take on one worker.")] = 120.0,
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn log level.")] = "info",
    tls_ca: Annotated[str | None, typer.Option(
        "--tls-ca", envvar="KVMESH_TLS_CA",
        help="PEM CA: talk TLS to the kvmesh service and workers.")] = None,
    tls_cert: Annotated[str | None, typer.Option(
        "--tls-cert", envvar="KVMESH_TLS_CERT",
        help="PEM client certificate (mutual TLS).")] = None,
    tls_key: Annotated[str | None, typer.Option(
        "--tls-key", envvar="KVMESH_TLS_KEY", help="PEM private key of --tls-cert.")] = None,
) -> None:
    """Serve an OpenAI-compatible API (completions, chat, streaming) routed by kvmesh."""
    try:
        from kvmesh.tls import tls_files

        config = build_config(service, model, model_dir, served_model_name, token,
                              tenant_keys, salt_secret, generate_timeout,
                              tls_files(tls_cert, tls_key, tls_ca))
    except (OSError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    import uvicorn

    from client.gateway.app import create_app

    uvicorn.run(create_app(config), host=host, port=port, log_level=log_level)


def register(app: typer.Typer) -> None:
    """Add the ``gateway`` verb to ``app``."""
    app.command("gateway")(gateway_cmd)
