"""kvmesh's retry rules: which failed gRPC call is tried again, and where.

:data:`TABLE` is the one statement, per failure source (service replica, worker) and status
code, of what a caller does next; ``docs/reliability.md`` shows it and a test keeps them
equal. Every caller decides with :func:`decide`. Above the table: a completed attempt is never
retried, and a stream that delivered a token never fails over.

See docs/architecture.md#rpc-auth-limits-tls-retries.
"""
from __future__ import annotations

import asyncio
import random
from enum import Enum
from typing import NamedTuple

import grpc


class Source(Enum):
    """Where a failed call went."""

    SERVICE = "service replica"
    WORKER = "worker"


class Action(Enum):
    """What the caller does with a failed call."""

    NEXT_REPLICA = "next replica"
    NEXT_CANDIDATE = "next candidate"
    SURFACE = "surfaced"


class Rule(NamedTuple):
    """One row of the table: a status code, the action per source, and why."""

    code: grpc.StatusCode
    service: Action
    worker: Action
    why: str


_R, _C, _S = Action.NEXT_REPLICA, Action.NEXT_CANDIDATE, Action.SURFACE
_SC = grpc.StatusCode

TABLE: tuple[Rule, ...] = (
    Rule(_SC.UNAVAILABLE, _R, _C,
         "down, unreachable, draining, or the stream dropped (also a worker stream that ends "
         "without its final message)"),
    Rule(_SC.DEADLINE_EXCEEDED, _R, _C,
         "hung or overloaded; the per-attempt deadline is the client's and reaches the "
         "server, which abandons the call, so its output is never delivered (a Route may have "
         "left a provisional entry on the slow replica; it expires)"),
    Rule(_SC.CANCELLED, _R, _C,
         "the server dropped the call (shutdown); the client's own cancel never retries"),
    Rule(_SC.RESOURCE_EXHAUSTED, _R, _C,
         "in-flight limit of this connection, or a request over this worker's KV pool: "
         "another replica or worker may have room (one over a size limit every server shares "
         "is refused fast by each)"),
    Rule(_SC.INTERNAL, _R, _C, "the server's fault (a failed engine step, a bug)"),
    Rule(_SC.UNKNOWN, _R, _C, "what gRPC answers for an unhandled server exception"),
    Rule(_SC.INVALID_ARGUMENT, _S, _S,
         "the request's fault: every server checks it the same way"),
    Rule(_SC.OUT_OF_RANGE, _S, _S, "the request's fault"),
    Rule(_SC.FAILED_PRECONDITION, _S, _S,
         "the cluster's configuration (e.g. hashing mismatch): retries would hide it"),
    Rule(_SC.UNAUTHENTICATED, _S, _S,
         "one token serves the whole cluster: a refusal is a configuration error that "
         "retries would only hide"),
    Rule(_SC.PERMISSION_DENIED, _S, _S, "as UNAUTHENTICATED"),
    Rule(_SC.NOT_FOUND, _S, _S, "names something that does not exist (same on every server)"),
    Rule(_SC.UNIMPLEMENTED, _S, _S,
         "a method or feature this deployment lacks: every server runs the same version"),
    Rule(_SC.ALREADY_EXISTS, _S, _S,
         "only RegisterWorker answers it (a live worker holds the id); routers never see it"),
    Rule(_SC.ABORTED, _S, _S, "not answered by kvmesh; no safe retry meaning"),
    Rule(_SC.DATA_LOSS, _S, _S, "not answered by kvmesh; never hidden"),
)

_BY_SOURCE: dict[Source, dict[grpc.StatusCode, Action]] = {
    Source.SERVICE: {rule.code: rule.service for rule in TABLE},
    Source.WORKER: {rule.code: rule.worker for rule in TABLE},
}


def decide(source: Source, code: grpc.StatusCode | None, *,
           delivered: bool = False) -> Action:
    """What to do after a call to ``source`` failed with ``code`` without completing.

    ``delivered``: a stream already handed tokens to its consumer (then always SURFACE).
    A code missing from the table (OK, None) is surfaced.
    """
    if delivered or code is None:
        return Action.SURFACE
    return _BY_SOURCE[source].get(code, Action.SURFACE)


def retried(source: Source, code: grpc.StatusCode | None) -> bool:
    """True when the table sends a failure from ``source`` with ``code`` elsewhere."""
    return decide(source, code) is not Action.SURFACE


class ReplicaRing:
    """Rotation order over service replicas that starts at the last one that answered.

    Invariant: :attr:`current` is always one of ``addresses`` (which is never empty)."""

    def __init__(self, addresses: list[str]) -> None:
        if not addresses:
            raise ValueError("at least one service address is needed")
        self.addresses = list(addresses)
        self._preferred = 0

    @property
    def current(self) -> str:
        """The replica asked first: the last one that answered."""
        return self.addresses[self._preferred]

    def order(self) -> list[str]:
        """All replicas, the last good one first, then the rest in configured order."""
        start = self._preferred
        return self.addresses[start:] + self.addresses[:start]

    def mark_good(self, address: str) -> None:
        """Remember ``address`` as the replica to ask first next time."""
        self._preferred = self.addresses.index(address)

    def mark_failed(self, address: str) -> None:
        """``address`` failed in a way the table retries: when it is :attr:`current`, the
        next replica in configured order becomes current (a stale report changes nothing)."""
        if self.current == address:
            self._preferred = (self._preferred + 1) % len(self.addresses)


class Backoff:
    """Exponential backoff with full jitter, for a caller that keeps retrying.

    The n-th wait since the last :meth:`reset` (n = 0, 1, ...) is drawn uniformly from
    ``[0, min(cap, base * factor**n)]``: the ceiling doubles (by default) up to ``cap``, and
    the jitter spreads the retries of many workers that lost the same service, so they do
    not return in lockstep. ``rand`` makes it deterministic in tests (``random.Random(seed)``).
    """

    def __init__(self, base: float = 0.1, cap: float = 2.0, factor: float = 2.0,
                 rand: random.Random | None = None) -> None:
        if not 0 < base <= cap or factor < 1:
            raise ValueError("need 0 < base <= cap and factor >= 1")
        self.base, self.cap, self.factor = base, cap, factor
        self._rand = rand or random.Random()
        self._ceiling = base

    @property
    def ceiling(self) -> float:
        """The upper bound of the next wait."""
        return self._ceiling

    def next(self) -> float:
        """The next wait in seconds; raises the ceiling for the one after."""
        wait = self._rand.uniform(0.0, self._ceiling)
        self._ceiling = min(self.cap, self._ceiling * self.factor)
        return wait

    def reset(self) -> None:
        """A call succeeded: the next wait starts from ``base`` again."""
        self._ceiling = self.base

    async def sleep(self) -> None:
        """Wait :meth:`next` seconds."""
        await asyncio.sleep(self.next())
