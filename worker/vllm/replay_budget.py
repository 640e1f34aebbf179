"""How many buffered batches each caller of a worker's replay socket may pull, and how fast.

One 9-byte replay request used to be answered with the whole buffer (10,000 batches, tens of
MiB): an amplifier, repeated as often as anyone liked. Two bounds now hold:

- per request: at most ``max_batches`` batches and ``max_bytes`` bytes of payload (the
  publisher's ``replay_max_batches``/``replay_max_bytes``); the answer then ends with the end
  marker, and a consumer asks again from where it stopped;
- per caller: a bucket of ``burst`` batches refilled at ``rate`` batches a second; every
  request costs at least one, so empty replays are bounded too. A request finding the bucket
  empty is not answered (counted as ``replays_refused``): to the consumer this is a replay
  socket that did not answer, which it already survives (``bridge.subscriber``: the gap
  clears the engine's entries, the index under-claims).

The defaults let a legitimate consumer do what one does: a full replay when it connects and a
second one from 0 when it finds the engine restarted (``burst``: two buffers), then probes
and gap fills of a few batches.

Who "a caller" is: the CURVE client key when the socket is CURVE (the ZAP handler's
``User-Id``), otherwise the peer's address. Not the ROUTER routing id: every connection gets a
fresh one (the bridge opens one per request) and a caller may choose its own, so it bounds no
one. The set of callers is bounded by construction: without CURVE a replay socket binds only
loopback (``kvmesh.events.zmq_curve.is_local``), with CURVE only listed keys get in.
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
