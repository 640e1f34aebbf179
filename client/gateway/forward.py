"""Forward a request's original body to HTTP engines (vLLM servers), best candidate first.

The body goes byte for byte (only the tenancy's ``cache_salt`` may change) to listed engines
only, and the answer comes back unchanged (hidden cached-token counts zeroed). An engine that
fails or answers 5xx is skipped while nothing reached the caller. The caller's API key never
reaches an engine; the engine's own key does.

See docs/architecture.md#the-openai-gateway.
"""
from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import httpx2
from fastapi.responses import Response

from client.gateway.engines import EngineList
from client.gateway.hidden_usage import hide_in_body, hide_in_stream
from client.gateway.slots import Lease, LeasedStream
from client.results import Candidate

log = logging.getLogger("client.gateway")

_PASSED_HEADERS = ("content-type", "cache-control", "x-request-id")
_FORWARDED_HEADERS = ("x-request-id", "traceparent", "tracestate")


@dataclass
class Relayed:
    """An engine's answer ready to relay: ``body`` (whole) or ``chunks`` (a stream)."""

    candidate: Candidate
    status: int
    headers: dict[str, str]
    body: bytes | None = None
    chunks: AsyncIterator[bytes] | None = None


class Forwarder:
    """One HTTP client (connection pool) for every listed engine; ``close`` when done."""

    def __init__(self, timeout: float, engines: EngineList | None = None,
                 connect_timeout: float = 5.0) -> None:
        self.engines = engines or EngineList()
        self._client = httpx2.AsyncClient(
            timeout=httpx2.Timeout(timeout, connect=connect_timeout), trust_env=False,
            limits=httpx2.Limits(max_connections=None, max_keepalive_connections=64))

    def _headers(self, incoming: dict[str, str], key: str | None) -> dict[str, str]:
        out = {"content-type": "application/json", "accept-encoding": "identity"}
        out.update({k: v for k, v in incoming.items() if k in _FORWARDED_HEADERS})
        if key:
            out["authorization"] = f"Bearer {key}"
        return out

    async def send(self, candidates: Sequence[Candidate], path: str, body: bytes, *,
                   stream: bool, incoming: dict[str, str] | None = None,
                   hide_cached: bool = False) -> tuple[Relayed | None, list[str]]:
        """The first listed engine's answer that is not a failure, and the failures before
        it (one line each, with the engine's address: for the log). ``None`` when all
        failed. A candidate the engine list does not name is a failure that sent nothing
        (callers filter them first: ``EngineList.allowed``). ``hide_cached``: the answer's
        cached-token counts are zeroed."""
        failures: list[str] = []
        incoming = {k.lower(): v for k, v in (incoming or {}).items()}
        for cand in candidates:
            listed = self.engines.allowed(cand.address)
            if listed is None:
                failures.append(f"{cand.address}: not in the gateway's engine list")
                continue
            headers = self._headers(incoming, self.engines.key(listed))
            url = listed + path
            try:
                resp = await self._client.send(
                    self._client.build_request("POST", url, content=body, headers=headers),
                    stream=True)
            except httpx2.HTTPError as exc:
                failures.append(f"{cand.address}: {type(exc).__name__}: {exc}")
                continue
            if resp.status_code >= 500:
                await resp.aclose()
                failures.append(f"{cand.address}: HTTP {resp.status_code}")
                continue
            passed = {k: v for k, v in resp.headers.items() if k.lower() in _PASSED_HEADERS}
            if stream:
                chunks = _relay(resp)
                if hide_cached:
                    chunks = hide_in_stream(chunks)
                return Relayed(cand, resp.status_code, passed, chunks=chunks), failures
            try:
                content = await resp.aread()
            except httpx2.HTTPError as exc:  # cut short: nothing reached the caller yet
                failures.append(f"{cand.address}: {type(exc).__name__} reading the body")
                continue
            finally:
                await resp.aclose()
            if hide_cached:
                content = hide_in_body(content)
            return Relayed(cand, resp.status_code, passed, body=content), failures
        return None, failures

    async def close(self) -> None:
        await self._client.aclose()


async def _relay(resp: httpx2.Response) -> AsyncIterator[bytes]:
    """The engine's stream as it arrives; a drop after the first byte ends the stream (the
    caller sees it end without ``[DONE]``, as from the engine itself)."""
    try:
        async for chunk in resp.aiter_raw():
            yield chunk
    except httpx2.HTTPError as exc:
        log.warning("engine stream from %s broke: %s", resp.url, exc)
    finally:
        await resp.aclose()


def relay(relayed: Relayed, lease: Lease, worker_header: str,
          stream_headers: dict[str, str], extra: dict[str, str] | None = None) -> Response:
    """An engine's answer as the caller's, with ``extra`` headers (the gateway's own, e.g.
    the cache scope); ``lease`` is released when it is complete."""
    headers = {**relayed.headers, **(extra or {}), worker_header: relayed.candidate.worker_id}
    if relayed.chunks is None:
        lease.release()
        return Response(relayed.body, status_code=relayed.status, headers=headers)
    return LeasedStream(relayed.chunks, status_code=relayed.status, lease=lease,
                        headers={**stream_headers, **headers})
