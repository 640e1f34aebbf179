"""``kvmesh service``: run the metadata service in the foreground.

``register(app)`` adds the command to a Typer app (client/cli.py wires it); ``python -m
service`` runs the same command on its own. Heavy imports (grpc, redis) happen only when the
command runs, so ``kvmesh --help`` stays instant.
"""
from __future__ import annotations

import typer

from service.config import ServiceConfig

_DEFAULTS = ServiceConfig()


def register(app: typer.Typer) -> None:
    """Add the ``service`` and ``worker-token`` commands to ``app``."""
    register_service(app)
    register_worker_token(app)


def register_service(app: typer.Typer) -> None:
    """Add only the ``service`` command (``python -m service`` is that command alone)."""

    @app.command("service")
    def service(
        port: int = typer.Option(50051, help="gRPC port (0: a free one, printed at start)."),
        host: str = typer.Option("127.0.0.1", help="Interface to bind (0.0.0.0: all)."),
        redis_url: str | None = typer.Option(None, envvar="KVMESH_REDIS_URL",
                                             help="Redis/Valkey URL of the shared index."),
        backend: str = typer.Option("auto", help="redis | memory | auto (redis iff a URL "
                                    "is given)."),
        token: str | None = typer.Option(None, envvar="KVMESH_TOKEN",
                                         help="Router token: required on Route/Stats, "
                                         "never accepted on worker calls (so it needs "
                                         "--worker-secret or --worker-token)."),
        worker_token: str | None = typer.Option(
            None, envvar="KVMESH_WORKER_TOKEN",
            help="Separate token for Register/Heartbeat/Publish/Sync."),
        metrics_port: int | None = typer.Option(None, help="Serve Prometheus metrics here."),
        hash_seed: str | None = typer.Option(
            None, envvar="KVMESH_HASH_SEED", help="Root hash seed; default as vLLM: "
            "PYTHONHASHSEED if set, else 'vllm-none-hash'."),
        policy: str = typer.Option("kvmesh", help="Default routing policy: kvmesh, "
                                   "prefix_only, least_loaded, round_robin, random."),
        worker_secret: str | None = typer.Option(
            None, envvar="KVMESH_WORKER_SECRET",
            help="Secret of worker tokens bound to their worker id (mint them with "
            "`kvmesh worker-token`); at least 16 bytes."),
        tls_cert: str | None = typer.Option(None, help="PEM certificate (with --tls-key)."),
        tls_key: str | None = typer.Option(None, help="PEM private key."),
        tls_ca: str | None = typer.Option(None, help="PEM CA of client certificates (with "
                                          "--tls-client-auth)."),
        tls_client_auth: bool = typer.Option(False, help="Require client certificates "
                                             "signed by --tls-ca (mutual TLS)."),
        max_message_bytes: int = typer.Option(_DEFAULTS.max_message_bytes,
                                              help="Largest request, bytes."),
        max_inflight_per_conn: int = typer.Option(
            _DEFAULTS.max_inflight_per_conn, help="Calls in flight per client connection "
            "(0: unlimited)."),
        max_prompt_tokens: int = typer.Option(_DEFAULTS.max_prompt_tokens,
                                              help="Longest Route prompt, tokens."),
        max_batch_events: int = typer.Option(_DEFAULTS.max_batch_events,
                                             help="Events in one PublishEvents."),
        max_batch_hashes: int = typer.Option(
            _DEFAULTS.max_batch_hashes, help="Block hashes in one PublishEvents/SyncWorker."),
        max_snapshot_blocks: int = typer.Option(_DEFAULTS.max_snapshot_blocks,
                                                help="Blocks in one SyncWorker snapshot."),
        max_mm_items: int = typer.Option(_DEFAULTS.max_mm_items,
                                         help="Multimodal items in one Route."),
        indexed_blocks_per_pool: int = typer.Option(
            _DEFAULTS.indexed_blocks_per_pool, help="A worker may index at most this many "
            "times the total_blocks it reports (and at least --min-indexed-cap)."),
        min_indexed_cap: int = typer.Option(_DEFAULTS.min_indexed_cap,
                                            help="Blocks any worker may index."),
        log_level: str = typer.Option("info", help="debug | info | warning | error."),
    ) -> None:
        """Run the metadata service (index + routing) until Ctrl-C / SIGTERM."""
        import asyncio
        import logging

        from kvmesh.hashing import resolve_seed
        from service.config import ServiceConfig

        kind = backend if backend != "auto" else ("redis" if redis_url else "memory")
        logging.basicConfig(level=log_level.upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            cfg = ServiceConfig(backend=kind, redis_url=redis_url, token=token or None,
                                worker_token=worker_token or None, metrics_port=metrics_port,
                                worker_secret=worker_secret or None,
                                hash_seed=resolve_seed(None, hash_seed), policy=policy,
                                tls_cert_file=tls_cert, tls_key_file=tls_key,
                                tls_ca_file=tls_ca, tls_client_auth=tls_client_auth,
                                max_message_bytes=max_message_bytes,
                                max_inflight_per_conn=max_inflight_per_conn,
                                max_prompt_tokens=max_prompt_tokens,
                                max_batch_events=max_batch_events,
                                max_batch_hashes=max_batch_hashes,
                                max_snapshot_blocks=max_snapshot_blocks,
                                max_mm_items=max_mm_items,
                                indexed_blocks_per_pool=indexed_blocks_per_pool,
                                min_indexed_cap=min_indexed_cap)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from e
        asyncio.run(_serve(f"{host}:{port}", cfg))


def register_worker_token(app: typer.Typer) -> None:
    """Add the ``worker-token`` command (mints a worker's bound token)."""

    @app.command("worker-token")
    def worker_token_cmd(
        worker_id: str = typer.Option(..., help="The worker id the token is bound to."),
        secret: str = typer.Option(..., envvar="KVMESH_WORKER_SECRET",
                                   help="The service's --worker-secret."),
    ) -> None:
        """Print the token that lets one worker (and only it) register and publish."""
        from service import worker_tokens

        try:
            typer.echo(worker_tokens.mint(secret, worker_id))
        except ValueError as e:
            raise typer.BadParameter(str(e)) from e


async def _serve(address: str, cfg: ServiceConfig) -> None:
    """Serve until SIGINT/SIGTERM, then stop with a 1 s grace period."""
    import asyncio
    import signal

    from service.server import create_server

    server, port = await create_server(address, cfg)
    await server.start()
    host = address.rpartition(":")[0]
    extra = f", metrics on :{server.metrics_port}" if server.metrics_port else ""
    print(f"kvmesh service listening on {host}:{port} (backend {cfg.backend}, policy "
          f"{cfg.policy}{extra})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=1.0)
