"""The offers a source holds: blocks pullable once, by whoever presents the offer's key.

Invariants: an offer is handed out (``take``) at most once; an offer past its deadline is
never handed out and its blocks are released at the next sweep; a key that was never offered,
or was already taken, is answered "refused", one that lapsed "expired" (remembered for a
bounded number of keys, after which it too reads "refused"). Every offer ends exactly once
(:meth:`Offer.finish`): its buffers are released and its ``on_done`` told how ("sent": every
frame left the source; "failed": the pull stopped half way; "expired"; "closed": the server
closed), so a source can hold a read lease on the blocks for exactly as long as needed.

See docs/architecture.md#peer-kv-transfer-the-data-plane.
"""
from __future__ import annotations

import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvmesh.transfer.frames import KEY_BYTES, TransferError

log = logging.getLogger(__name__)

_LAPSED_KEPT = 4096


@dataclass(slots=True)
class Offer:
    transport: str
    blocks: list[memoryview]
    block_bytes: int
    deadline: float
    on_done: Callable[[str], None] | None = None
    key: bytes = field(default_factory=lambda: secrets.token_bytes(KEY_BYTES))

    def finish(self, outcome: str) -> None:
        """End the offer (once; later calls do nothing): release its blocks, tell on_done."""
        self.blocks = []
        done, self.on_done = self.on_done, None
        if done is not None:
            try:
                done(outcome)
            except Exception:  # the source's callback must not break the data plane
                log.exception("an offer's on_done callback failed")


class OfferBook:
    """Offers by key."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._offers: dict[bytes, Offer] = {}
        self._lapsed: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._offers)

    def add(self, transport: str, blocks: Sequence[memoryview | bytes], ttl_s: float,
            on_done: Callable[[str], None] | None = None) -> Offer:
        """A new offer of ``blocks`` (all one size, at least one) for ``ttl_s`` seconds."""
        views = [memoryview(b).cast("B") for b in blocks]
        if not views:
            raise ValueError("an offer needs at least one block")
        size = len(views[0])
        if size == 0 or any(len(v) != size for v in views):
            raise ValueError("an offer's blocks must all have the same, non-zero size")
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self.sweep()
        offer = Offer(transport, views, size, self._clock() + ttl_s, on_done)
        self._offers[offer.key] = offer
        return offer

    def take(self, key: bytes, transport: str) -> Offer:
        """The offer under ``key`` for ``transport``, removed so no one can take it again;
        TransferError "refused" (unknown, taken, another transport) or "expired"."""
        self.sweep()
        offer = self._offers.get(key)
        if offer is None:
            reason = "expired" if key in self._lapsed else "refused"
            raise TransferError(reason, 0, f"no offer under this key ({reason})")
        if offer.transport != transport:
            raise TransferError("refused", 0, f"the offer is for {offer.transport}, "
                                f"not {transport}")
        del self._offers[key]
        return offer

    def sweep(self) -> None:
        """Drop every offer past its deadline (releasing its blocks)."""
        now = self._clock()
        for key in [k for k, o in self._offers.items() if o.deadline <= now]:
            offer = self._offers.pop(key)
            self._lapsed[key] = None
            if len(self._lapsed) > _LAPSED_KEPT:
                self._lapsed.popitem(last=False)
            offer.finish("expired")

    def clear(self) -> None:
        """Drop every offer (the server closes)."""
        offers, self._offers = list(self._offers.values()), {}
        for offer in offers:
            offer.finish("closed")
