"""Whether the cluster behind the gateway can serve: ``GET /health``; and ``GET /ping``.

``/health`` is 200 only when a service replica answers ``Stats`` with a live worker, else 503
with a reason that names no machine; the verdict is cached ``ttl_s`` and a check gives up
after ``timeout_s``. ``/ping`` is liveness only.

See docs/architecture.md#the-openai-gateway.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from client.errors import KvmeshError

log = logging.getLogger("client.gateway")

DEFAULT_TTL_S = 2.0
DEFAULT_TIMEOUT_S = 2.0
_REFUSED = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})


@dataclass(frozen=True)
class Verdict:
    """``healthy``, else ``reason`` (for anyone: no addresses) and ``detail`` (for the log)."""

    healthy: bool
    reason: str = ""
    detail: str = ""


def judge(stats: dict[str, Any]) -> Verdict:
    """The verdict on a ``Stats`` answer (``client.convert.stats_dict``): healthy when at
    least one listed worker is alive."""
    workers = stats.get("workers") or []
    if any(w.get("alive") for w in workers):
        return Verdict(True)
    return Verdict(False, "the metadata service lists no live worker",
                   f"{len(workers)} worker(s) listed by {stats.get('service')}, none alive")


class ClusterHealth:
    """Cached, single-flight readiness checks through ``stats`` (the gateway's kvmesh
    client's ``stats``); use from one event loop."""

    def __init__(self, stats: Callable[[], Awaitable[dict[str, Any]]], *,
                 ttl_s: float = DEFAULT_TTL_S, timeout_s: float = DEFAULT_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._stats = stats
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._verdict: Verdict | None = None
        self._at = 0.0
        self._pending: asyncio.Future[Verdict] | None = None

    async def verdict(self) -> Verdict:
        """The cluster's state, asking the service only when the cached verdict expired."""
        if self._verdict is not None and self._clock() - self._at < self.ttl_s:
            return self._verdict
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._check())
        # shielded: a probe that hangs up does not cancel the check the others wait for
        return await asyncio.shield(self._pending)

    async def _check(self) -> Verdict:
        try:
            verdict = judge(await asyncio.wait_for(self._stats(), self.timeout_s))
        except TimeoutError:
            verdict = Verdict(False, "no metadata service replica answered",
                              f"Stats took longer than {self.timeout_s} s")
        except KvmeshError as err:
            reason = ("the metadata service refused the gateway's credentials (--token, TLS)"
                      if err.code in _REFUSED else "no metadata service replica answered")
            verdict = Verdict(False, reason, f"{err.code.name}: {err.message}")
        except Exception as exc:  # noqa: BLE001 - a probe must answer, whatever broke
            verdict = Verdict(False, "the gateway could not ask the metadata service",
                              f"{type(exc).__name__}: {exc}")
        finally:
            self._pending = None
        self._log_change(verdict)
        self._verdict, self._at = verdict, self._clock()
        return verdict

    def _log_change(self, verdict: Verdict) -> None:
        before = self._verdict
        if before is not None and before.healthy == verdict.healthy \
                and before.reason == verdict.reason:
            return
        if verdict.healthy:
            if before is not None:
                log.warning("cluster healthy again")
        else:
            log.warning("cluster unhealthy: %s (%s)", verdict.reason, verdict.detail)


def install_health_routes(app: FastAPI, health: ClusterHealth, model: str) -> None:
    """``GET``/``HEAD /health`` (readiness, see the module) and ``/ping`` (liveness)."""

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def ready() -> JSONResponse:
        verdict = await health.verdict()
        if verdict.healthy:
            return JSONResponse({"status": "ok", "model": model})
        return JSONResponse({"status": "unhealthy", "model": model, "reason": verdict.reason},
                            status_code=503)

    @app.api_route("/ping", methods=["GET", "HEAD"])
    async def ping() -> dict[str, str]:
        return {"status": "ok"}
