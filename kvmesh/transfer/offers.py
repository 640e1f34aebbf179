"""The offers a source holds: blocks pullable once, by whoever presents the offer's key.

Invariants: an offer is handed out (``take``) at most once; an offer past its deadline is
never handed out and its blocks are released at the next sweep; a key that was never offered,
or was already taken, is answered "refused", one that lapsed "expired" (remembered for a
bounded number of keys, after which it too reads "refused").

See docs/architecture.md#peer-kv-transfer-the-data-plane.
"""
from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvmesh.transfer.frames import KEY_BYTES, TransferError

_LAPSED_KEPT = 4096


@dataclass(slots=True)
class Offer:
    transport: str
    blocks: list[memoryview]
    block_bytes: int
    deadline: float
    key: bytes = field(default_factory=lambda: secrets.token_bytes(KEY_BYTES))


class OfferBook:
    """Offers by key. ``on_drop`` is called with each offer that lapses unpulled."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 on_drop: Callable[[Offer], None] | None = None) -> None:
        self._clock = clock
        self._on_drop = on_drop
        self._offers: dict[bytes, Offer] = {}
        self._lapsed: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._offers)

    def add(self, transport: str, blocks: Sequence[memoryview | bytes], ttl_s: float) -> Offer:
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
        offer = Offer(transport, views, size, self._clock() + ttl_s)
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
            if self._on_drop is not None:
                self._on_drop(offer)

    def clear(self) -> None:
        for offer in self._offers.values():
            if self._on_drop is not None:
                self._on_drop(offer)
        self._offers.clear()
