"""Failover decisions shared by the sync and asyncio clients (no I/O here).

Service replicas are stateless and interchangeable: calls go to the last replica that
answered (``kvmesh.rpc.retry.ReplicaRing``) and rotate through the others when the retry table
(``kvmesh.rpc.retry.TABLE``) says so. Workers are tried in the service's ranking order (best
candidate first): :class:`Candidates` is the one statement of "route, then try candidates in
order", which both clients drive with their own I/O (a blocking loop, an ``async for``).
:class:`Failures` turns the failed attempts of one call into the error the caller sees,
naming every attempt.
"""
from __future__ import annotations

from collections.abc import Iterator

import grpc

from client.convert import StreamAssembler, fetch_message
from client.errors import BrokenStream, KvmeshError
from client.results import Candidate, GenerateResult, RouteResult, TokenChunk
from kvmesh.rpc.engine_address import is_http
from kvmesh.rpc.retry import Action, Source, decide
from kvmesh.v1 import worker_pb2

__all__ = ["Attempt", "Candidates", "Failures", "no_worker_error"]


class Failures:
    """Collects the failures of one failover loop and turns them into the final error."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.errors: list[tuple[str, grpc.StatusCode, str]] = []

    def add(self, where: str, code: grpc.StatusCode, message: str) -> None:
        """Record that ``where`` failed with ``code``/``message``."""
        self.errors.append((where, code, message))

    def failed(self, source: Source, where: str, err: grpc.RpcError | BrokenStream, *,
               delivered: bool = False) -> None:
        """Record ``err`` from ``where`` (a dropped stream counts as UNAVAILABLE) and raise
        the error to surface when the retry table does not send it elsewhere."""
        if isinstance(err, BrokenStream):
            self.add(where, grpc.StatusCode.UNAVAILABLE, str(err))
        else:
            self.add(where, err.code(), err.details() or "")
        if decide(source, self.last_code, delivered=delivered) is Action.SURFACE:
            raise self.surface() from None

    @property
    def last_code(self) -> grpc.StatusCode | None:
        """The code of the latest failure (None before any)."""
        return self.errors[-1][1] if self.errors else None

    def _detail(self, errors: list[tuple[str, grpc.StatusCode, str]]) -> str:
        return "; ".join(f"{where}: {code.name} {msg}" for where, code, msg in errors)

    def error(self) -> KvmeshError:
        """Every option failed: a ``KvmeshError`` with the last failure's code and every
        failure in the message."""
        if not self.errors:
            return KvmeshError(grpc.StatusCode.UNAVAILABLE, f"no {self.what} to try")
        n = len(self.errors)
        return KvmeshError(self.errors[-1][1],
                           f"all {n} {self.what}(s) failed ({self._detail(self.errors)})")

    def surface(self) -> KvmeshError:
        """The last failure is not retried: its code and message, followed by the earlier
        failures when there were any (the message is the server's own text otherwise)."""
        if not self.errors:
            return self.error()
        *earlier, (_, code, message) = self.errors
        if earlier:
            message = (f"{message} (after {len(earlier)} failed {self.what}(s): "
                       f"{self._detail(earlier)})")
        return KvmeshError(code, message)


def no_worker_error() -> KvmeshError:
    """The error for a routing answer without any candidate worker."""
    return KvmeshError(grpc.StatusCode.UNAVAILABLE,
                       "no live worker can take this request (the service returned no "
                       "candidates)")


class Attempt:
    """One ``Generate`` call on one candidate: the stream so far and what it handed on.

    ``finished``: the worker's final message arrived (the request is complete, whatever the
    transport does next). ``delivered``: a token went to a streaming consumer.
    """

    def __init__(self, cand: Candidate, number: int, request: worker_pb2.GenerateRequest,
                 stream: bool) -> None:
        self.cand = cand
        self.request = request
        self.finished = False
        self.delivered = False
        self._stream = stream
        self._assembler = StreamAssembler(cand, number)

    def feed(self, message: worker_pb2.GenerateResponse) -> TokenChunk | None:
        """Add one stream message; the chunk to hand to a streaming consumer, if any
        (none for a non-streaming call, none after the final message)."""
        if self.finished:
            return None
        self.finished = self._assembler.feed(message)
        if not (self._stream and message.token_ids):
            return None
        self.delivered = True
        return TokenChunk(list(message.token_ids), self.cand.worker_id, self.cand.address)

    def result(self) -> GenerateResult:
        """The complete result; raises ``BrokenStream`` if the stream ended early."""
        return self._assembler.result()


class Candidates:
    """The attempts of one routed request, in ranking order, and what each failure means.

    Drive it as: ``for attempt in candidates``: call ``Generate(attempt.request)``, feed every
    message to ``attempt``; on success return ``attempt.result()``; on a ``grpc.RpcError`` or
    ``BrokenStream`` ask :meth:`failed`; after the loop raise :meth:`error`. Each attempt's
    request carries that candidate's own fetch plan (or none). Candidates
    without an address, and HTTP engines (``http://`` addresses: a vLLM server speaks no
    ``WorkerService``; ``kvmesh gateway`` forwards to them), are recorded and skipped.
    """

    def __init__(self, routed: RouteResult, request: worker_pb2.GenerateRequest, *,
                 stream: bool) -> None:
        self.routed = routed
        self.request = request
        self.stream = stream
        self.failures = Failures("candidate worker")

    def __iter__(self) -> Iterator[Attempt]:
        for number, cand in enumerate(self.routed.candidates, 1):
            if not cand.address:
                self.failures.add(cand.worker_id, grpc.StatusCode.UNAVAILABLE, "no address")
                continue
            if is_http(cand.address):
                self.failures.add(cand.address, grpc.StatusCode.UNAVAILABLE,
                                  "an HTTP engine (no kvmesh WorkerService)")
                continue
            self.request.index_matched_tokens = cand.matched_tokens
            by_tier = self.request.index_matched_tokens_by_tier
            by_tier.clear()  # one request message, re-sent to each candidate in turn
            by_tier.update(cand.matched_tokens_by_tier)
            if cand.fetch is not None:  # this candidate's own plan: its ticket names it
                self.request.fetch.CopyFrom(fetch_message(cand.fetch))
            else:
                self.request.ClearField("fetch")
            yield Attempt(cand, number, self.request, self.stream)

    def failed(self, attempt: Attempt, err: grpc.RpcError | BrokenStream
               ) -> GenerateResult | None:
        """``attempt``'s call raised ``err``. Returns its result when the final message
        had arrived (a finished request never runs again); raises ``KvmeshError`` when the
        table surfaces the failure or a streaming consumer already got tokens; ``None``:
        try the next candidate."""
        if attempt.finished:
            return attempt.result()
        self.failures.failed(Source.WORKER, attempt.cand.address, err,
                             delivered=attempt.delivered)
        return None

    def error(self) -> KvmeshError:
        """Every candidate failed (or there was none to try)."""
        return self.failures.error()
