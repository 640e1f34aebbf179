"""How many buffered batches each caller of a worker's replay socket may pull, and how fast.

Per request at most ``max_batches`` batches and ``max_bytes`` bytes; per caller (CURVE key,
else peer address) a token bucket, every request costing at least one: a refused request is
just a replay that did not answer, which consumers survive.

See docs/architecture.md#worker-vllm-face.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import zmq

LOCAL = "local"  # the caller of an ipc/inproc socket (no peer address)


def caller_of(frame: zmq.Frame) -> str:
    """The caller a received frame came from (module contract): ``curve:KEY``, else
    ``peer:ADDRESS``, else ``local``."""
    for prop, tag in (("User-Id", "curve"), ("Peer-Address", "peer")):
        try:
            value = frame.get(prop)
        except zmq.ZMQError:  # the property is absent for this transport/mechanism
            continue
        if value:
            return f"{tag}:{value}"
    return LOCAL


class ReplayBudget:
    """Per-caller token buckets, in batches (see the module contract)."""

    def __init__(self, burst: int, rate: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if burst < 1 or rate <= 0:
            raise ValueError("a replay budget needs burst >= 1 and rate > 0")
        self.burst = burst
        self.rate = rate
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # caller -> (tokens, at)

    def allowance(self, caller: str) -> int | None:
        """Batches ``caller`` may pull now, or ``None`` when its bucket is empty (the request
        is not served)."""
        tokens = self._refill(caller)
        return int(tokens) if tokens >= 1 else None

    def spend(self, caller: str, batches: int) -> None:
        """Charge ``caller`` for a request answered with ``batches`` (at least one)."""
        self._buckets[caller] = (self._refill(caller) - max(batches, 1), self.clock())

    def _refill(self, caller: str) -> float:
        now = self.clock()
        tokens, at = self._buckets.get(caller, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate)
        self._buckets[caller] = (tokens, now)
        return tokens
