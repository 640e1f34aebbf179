"""``kvmesh service``: run the metadata service in the foreground.

``register(app)`` adds the command to a Typer app (client/cli.py wires it); ``python -m
service`` runs the same command on its own. Heavy imports (grpc, redis) happen only when the
command runs, so ``kvmesh --help`` stays instant.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from service.config import ServiceConfig


def register(app: typer.Typer) -> None:
    """Add the ``service`` command to ``app``."""

    @app.command("service")
    def service(
        port: int = typer.Option(50051, help="gRPC port (0: a free one, printed at start)."),
        host: str = typer.Option("127.0.0.1", help="Interface to bind (0.0.0.0: all)."),
        redis_url: str | None = typer.Option(None, envvar="KVMESH_REDIS_URL",
                                             help="Redis/Valkey URL of the shared index."),
        backend: str = typer.Option("auto", help="redis | memory | auto (redis iff a URL "
                                    "is given)."),
        token: str | None = typer.Option(None, envvar="KVMESH_TOKEN",
                                         help="Bearer token required on every call."),
        worker_token: str | None = typer.Option(
            None, envvar="KVMESH_WORKER_TOKEN",
            help="Separate token for Register/Heartbeat/Publish/Sync."),
        metrics_port: int | None = typer.Option(None, help="Serve Prometheus metrics here."),
        hash_seed: str | None = typer.Option(None, envvar="KVMESH_HASH_SEED",
                                             help="Root hash seed (default vLLM's)."),
        policy: str = typer.Option("kvmesh", help="Default routing policy: kvmesh, "
                                   "prefix_only, least_loaded, round_robin, random."),
        tls_cert: str | None = typer.Option(None, help="PEM certificate (with --tls-key)."),
        tls_key: str | None = typer.Option(None, help="PEM private key."),
        log_level: str = typer.Option("info", help="debug | info | warning | error."),
    ) -> None:
        """Run the metadata service (index + routing) until Ctrl-C / SIGTERM."""
        import asyncio
        import logging

        from kvmesh.hashing import DEFAULT_SEED
        from service.config import ServiceConfig

        kind = backend if backend != "auto" else ("redis" if redis_url else "memory")
        logging.basicConfig(level=log_level.upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            cfg = ServiceConfig(backend=kind, redis_url=redis_url, token=token or None,
                                worker_token=worker_token or None, metrics_port=metrics_port,
                                hash_seed=hash_seed or DEFAULT_SEED, policy=policy,
                                tls_cert_file=tls_cert, tls_key_file=tls_key)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from e
        asyncio.run(_serve(f"{host}:{port}", cfg))


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
