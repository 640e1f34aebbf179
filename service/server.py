"""The metadata service process: grpc.aio server + background refresh and janitor loops.

``create_server(addr, ServiceConfig(...))`` returns the server and its port. Replicas hold
no state beyond caches, so any number may serve one Redis. Refresh re-reads worker records
(and ends a degraded period; it also stores the start flags' tenant quotas once the index is
up); the janitor purges silent workers (atomic, so racing replicas are harmless). Also
serves ``grpc.health.v1`` and reflection.

See docs/architecture.md#the-service-process.
"""
from __future__ import annotations

import asyncio
import contextlib
import io
import logging
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from kvmesh.rpc.limits import RequestLimits, server_options
from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc as pb_grpc
from service.auth import service_auth
from service.clock import Clock, wall_ms
from service.config import ServiceConfig
from service.index import IndexBackend, IndexUnavailable, open_backend
from service.servicer import IndexServicer

log = logging.getLogger("kvmesh.service")
STOP_TASKS_S = 5.0  # how long stop() waits for its cancelled background loops
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["IndexService"].full_name


class IndexServer:
    """A created IndexService server; ``start`` / ``stop`` / ``wait_for_termination`` like
    ``grpc.aio.Server``, plus the background loops and the optional metrics endpoint."""

    def __init__(self, grpc_server: grpc.aio.Server, servicer: IndexServicer, port: int,
                 health_servicer: Any) -> None:
        self.grpc_server = grpc_server
        self.servicer = servicer
        self.port = port
        self.health = health_servicer
        self._tasks: list[asyncio.Task[None]] = []
        self._metrics_http: Any = None
        self.metrics_port: int | None = None

    @property
    def config(self) -> ServiceConfig:
        return self.servicer.cfg

    @property
    def backend(self) -> IndexBackend:
        return self.servicer.backend

    async def start(self) -> None:
        """Serve, start the background loops and (if configured) the metrics endpoint."""
        cfg = self.config
        with contextlib.suppress(IndexUnavailable):
            await self.servicer.router.refresh()  # a down index at start is fine: it is retried
        with contextlib.suppress(IndexUnavailable):
            await self.servicer.quotas.write_start()  # the --tenant-quota flags (retried too)
        await self.grpc_server.start()
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._tasks = [asyncio.create_task(self._every(cfg.refresh_interval_s, self._refresh)),
                       asyncio.create_task(self._every(cfg.janitor_interval_s, self._janitor))]
        if cfg.metrics_port is not None:
            from prometheus_client import start_http_server

            self._metrics_http, _ = start_http_server(
                cfg.metrics_port, addr=cfg.metrics_host, registry=self.servicer.metrics.registry)
            self.metrics_port = self._metrics_http.server_address[1]

    async def stop(self, grace: float | None = None) -> None:
        """Stop serving (waiting up to ``grace`` s for calls in flight) and release all."""
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            # Bounded: a loop step stuck in a call that ignores cancellation must not keep
            # the server from stopping (once, under load, a cancelled loop never came back).
            _, stuck = await asyncio.wait(self._tasks, timeout=STOP_TASKS_S)
            for task in stuck:
                out = io.StringIO()
                task.print_stack(file=out)
                log.warning("background loop still running %.0f s after its cancel; stopping "
                            "without it:\n%s", STOP_TASKS_S, out.getvalue())
        self._tasks = []
        with contextlib.suppress(Exception):
            await self.health.enter_graceful_shutdown()
        await self.grpc_server.stop(grace)
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()
            self._metrics_http = None
        self.servicer.close()
        await self.backend.close()

    async def wait_for_termination(self, timeout: float | None = None) -> bool:
        return await self.grpc_server.wait_for_termination(timeout)

    async def _every(self, interval: float, step: Any) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await step()
            except IndexUnavailable as e:
                log.debug("background step skipped: %s", e)
            except Exception:  # keep the loop alive whatever one step hits
                log.exception("background step failed")

    async def _refresh(self) -> None:
        try:
            if self.servicer.quotas.starting:
                await self.servicer.quotas.write_start()
            await self.servicer.router.refresh()
        except IndexUnavailable:
            self.servicer.router.mark_down()
            raise

    async def _janitor(self) -> None:
        deadline = self.servicer.clock() - int(self.config.purge_after_s * 1000)
        for rec in await self.backend.workers():
            if rec.heartbeat_ms < deadline and await self.backend.purge_worker(
                    rec.worker_id, heartbeat_before_ms=deadline):
                self.servicer.table.remove(rec.worker_id)
                log.info("purged worker %r (no heartbeat for %.1fs)", rec.worker_id,
                         self.config.purge_after_s)
        await self.backend.sweep()  # reclaims dropped entries, a bounded step per tick


async def create_server(address: str, config: ServiceConfig,
                        backend: IndexBackend | None = None,
                        clock: Clock = wall_ms) -> tuple[IndexServer, int]:
    """Build (not start) the service on ``address`` (``host:port``; port 0 picks a free one).

    ``backend`` defaults to the one ``config`` names; ``clock`` is every time the service
    reads (``service.clock``: tests pass one they move by hand). Returns the server and the
    bound port; call ``await server.start()`` next. Raises ``RuntimeError`` if the port
    cannot be bound and ``ValueError`` if a TLS file cannot be read. The server enforces
    ``config``'s tokens
    (``service.auth``), TLS, and request limits (``kvmesh.rpc.limits``).
    """
    if backend is None:
        backend = open_backend(config.backend, config.redis_url, config.redis_timeout_s,
                               cluster=config.redis_cluster)
    servicer = IndexServicer(config, backend, clock)
    # outermost first: per-connection and size limits + decoding, then the bearer token
    interceptors: list[grpc.aio.ServerInterceptor] = [RequestLimits(
        max_inflight=config.max_inflight_per_conn, max_message_bytes=config.max_message_bytes)]
    auth = service_auth(config)
    if auth is not None:
        interceptors.append(auth)
    options = [*server_options(config.max_message_bytes, config.max_inflight_per_conn),
               ("grpc.so_reuseport", 0)]
    server = grpc.aio.server(interceptors=interceptors, options=options)
    pb_grpc.add_IndexServiceServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME), server)
    try:
        creds = config.tls.server_credentials() if config.tls is not None else None
    except ValueError:
        await backend.close()
        raise
    try:
        port = (server.add_secure_port(address, creds) if creds is not None
                else server.add_insecure_port(address))
    except RuntimeError as e:
        await backend.close()
        raise RuntimeError(f"cannot bind {address}: {e}") from e
    if port == 0:
        await backend.close()
        raise RuntimeError(f"cannot bind {address}")
    return IndexServer(server, servicer, port, health_servicer), port
