"""Pins: cached device blocks kept resident for a requested or a hot prefix.

A pin holds one reference on a cached block, so it is never evicted. Pins cover chains from
block 0 (the pinned set is closed under "parent of"), one per hash, under a cap (10% of the
pool); explicit pins outrank automatic ones; each expires ``ttl_s`` after its last use. Pins
change only between steps (so a pinned block's KV is written) and yield to a request that
could never fit beside them. Pinning changes no hash, so it emits no KV event.

See docs/architecture.md#worker-kv-cache.
"""
from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from .block import KVCacheBlock
from .block_pool import BlockPool
from .request import KVRequest

AUTO_PIN_HITS = 8         # K: first admissions hitting a block within the window
AUTO_PIN_WINDOW_S = 60.0  # the window, and an automatic pin's TTL
PIN_CAP_FRACTION = 0.10   # default cap: this share of the device pool


class Pinned(int):
    """The blocks of a chain pinned now (an ``int``, as before), out of ``of`` asked for;
    ``capped``: the pin cap stopped it although this pool holds the next block (explicit
    pins fill the cap). Short and not capped: the pool holds no more of the chain."""

    def __new__(cls, n: int, of: int, capped: bool = False) -> Pinned:
        self = super().__new__(cls, n)
        self.of = of
        self.capped = capped
        return self

    def __reduce__(self) -> tuple:  # pickles and copies keep the reason
        return (Pinned, (int(self), self.of, self.capped))


@dataclass(slots=True)
class Pin:
    """One pinned block: the chain position it holds and when it expires."""

    block: KVCacheBlock
    parent: bytes | None  # the previous hash of the chain (None at block 0)
    depth: int            # position in the chain (0 = first block)
    ttl_s: float          # refresh period: the longest TTL it was pinned with
    expires_at: float
    auto: bool            # pinned because hot
    explicit: bool = True  # pinned on request (outranks automatic pins: see the module)


@dataclass(slots=True)
class _Deferred:
    """A chain to pin once ``req`` has computed ``num_tokens`` tokens (a warm-up)."""

    req: KVRequest
    chain: list[bytes]
    num_tokens: int
    ttl_s: float
    deadline: float


class PinTable:
    """The pins of one pool. Not thread-safe (the engine loop owns it, like the manager)."""

    def __init__(self, pool: BlockPool, cap: int | None = None, *, auto: bool = False,
                 clock: Callable[[], float] = time.monotonic, hot_hits: int = AUTO_PIN_HITS,
                 window_s: float = AUTO_PIN_WINDOW_S) -> None:
        if cap is not None and cap < 0:
            raise ValueError(f"pin cap must be >= 0, got {cap}")
        self.pool = pool
        self.cap = int(pool.num_blocks * PIN_CAP_FRACTION) if cap is None else cap
        self.auto = auto
        self.clock = clock
        self.hot_hits = hot_hits
        self.window_s = window_s
        self._pins: dict[bytes, Pin] = {}  # by hash, in pinning order
        self._hits: dict[bytes, deque[float]] = {}  # hash -> its last hot_hits hit times
        self._hot: list[list[bytes]] = []  # chains that turned hot, pinned at the next tick
        self._deferred: list[_Deferred] = []
        self._next_expiry = math.inf  # no pin expires before this (may be early, never late)

    def __len__(self) -> int:
        return len(self._pins)

    def get(self, block_hash: bytes) -> Pin | None:
        return self._pins.get(block_hash)

    @property
    def watching(self) -> bool:
        """Whether admissions' hits matter (pins to refresh, or hits to count)."""
        return self.auto or bool(self._pins)

    # --- pinning ----------------------------------------------------------------------

    @property
    def num_explicit(self) -> int:
        """Pins made on request (the cap's share automatic pins cannot take from them)."""
        return sum(p.explicit for p in self._pins.values())

    def pin(self, chain: Sequence[bytes], ttl_s: float, now: float, *,
            auto: bool = False) -> Pinned:
        """Pin ``chain`` from block 0 as far as the pool holds it and the cap allows (an
        explicit pin, ``auto=False``, displacing automatic ones at the cap), or refresh the
        blocks already pinned; return how many of its blocks are pinned now."""
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        parent: KVCacheBlock | None = None
        for depth, block_hash in enumerate(chain):
            pin = self._pins.get(block_hash)
            if pin is not None:
                if not _extends(pin.block, parent):
                    return Pinned(depth, len(chain))  # the hash on another prefix: a collision
                pin.ttl_s = max(pin.ttl_s, ttl_s)
                pin.expires_at = max(pin.expires_at, now + ttl_s)
                pin.auto = pin.auto or auto
                pin.explicit = pin.explicit or not auto
            else:
                block = self._holder(block_hash, parent)
                if block is None:
                    return Pinned(depth, len(chain))
                while len(self._pins) >= self.cap:
                    if auto or not self._displace_automatic():
                        return Pinned(depth, len(chain), capped=True)
                self.pool.touch((block,))
                pin = self._pins[block_hash] = Pin(
                    block, chain[depth - 1] if depth else None, depth, ttl_s, now + ttl_s, auto,
                    explicit=not auto)
                self._next_expiry = min(self._next_expiry, pin.expires_at)
            parent = pin.block
        return Pinned(len(chain), len(chain))

    def _displace_automatic(self) -> bool:
        """Release the automatic-only pin least worth keeping (soonest to expire, deepest
        first) with its descendants (automatic too: every ancestor of an explicit pin is
        explicit), for an explicit pin at the cap. ``False`` if every pin is explicit."""
        victims = [(p.expires_at, -p.depth, i, h)
                   for i, (h, p) in enumerate(self._pins.items()) if not p.explicit]
        if not victims:
            return False
        self._release({min(victims)[3]})
        return True

    def _holder(self, block_hash: bytes, parent: KVCacheBlock | None) -> KVCacheBlock | None:
        for block in self.pool.cached.get(block_hash, {}).values():
            if _extends(block, parent):
                return block
        return None

    def defer(self, req: KVRequest, chain: list[bytes], num_tokens: int, ttl_s: float,
              now: float) -> None:
        """Pin ``chain`` at the first tick after ``req`` computed ``num_tokens`` tokens (its
        KV is written then); forgotten if that does not happen within ``ttl_s``."""
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self._deferred.append(_Deferred(req, chain, num_tokens, ttl_s, now + ttl_s))

    def unpin(self, chain: Collection[bytes]) -> int:
        """Release the pins on these hashes and on their descendants, and forget their hit
        counts (an automatic pin comes back only after ``hot_hits`` new hits). Returns the
        number of blocks released."""
        for block_hash in chain:
            self._hits.pop(block_hash, None)
        return len(self._release({h for h in chain if h in self._pins}))

    def _release(self, roots: set[bytes]) -> list[Pin]:
        """Release ``roots`` and every pinned descendant; blocks are freed deepest first (in
        pinning order within one depth), so a chain's tail is evicted before its head."""
        if not roots:
            return []
        gone = set(roots)
        for block_hash, pin in sorted(self._pins.items(), key=lambda kv: kv[1].depth):
            if pin.parent is not None and pin.parent in gone:
                gone.add(block_hash)
        pins = sorted((self._pins.pop(h) for h in list(self._pins) if h in gone),
                      key=lambda p: -p.depth)
        self.pool.free_blocks(p.block for p in pins)
        return pins

    def release_all(self) -> int:
        """Release every pin and forget all hit counts and pending pins (cache reset)."""
        self._hits.clear()
        self._hot.clear()
        self._deferred.clear()
        self._next_expiry = math.inf
        return len(self._release(set(self._pins)))

    # --- time and use -----------------------------------------------------------------

    def tick(self, now: float) -> int:
        """Between steps: release expired pins, then take the deferred and hot pins that are
        due. Returns the number of blocks released."""
        released = 0
        if now >= self._next_expiry:
            released = len(self._release({h for h, p in self._pins.items()
                                          if p.expires_at <= now}))
            self._next_expiry = min((p.expires_at for p in self._pins.values()),
                                    default=math.inf)
        if self._deferred:
            waiting = []
            for d in self._deferred:
                if d.req.num_computed_tokens >= d.num_tokens:
                    self.pin(d.chain, d.ttl_s, now)
                elif now < d.deadline:
                    waiting.append(d)
            self._deferred = waiting
        if self._hot:
            hot, self._hot = self._hot, []
            for chain in hot:
                self.pin(chain, self.window_s, now, auto=True)
        return released

    def note_hits(self, hits: Sequence[KVCacheBlock], now: float, first: bool) -> None:
        """An admission hit ``hits`` (a chain from block 0): refresh the pins on them, and
        (automatic pinning, ``first`` admissions only) count the hits; the hot prefix of the
        chain is pinned at the next tick."""
        chain = [b.block_hash for b in hits if b.block_hash is not None]  # hits are cached
        for block_hash in chain:
            pin = self._pins.get(block_hash)
            if pin is not None:
                pin.expires_at = max(pin.expires_at, now + pin.ttl_s)
        if not (self.auto and first and chain):
            return
        hot = 0
        for i, block_hash in enumerate(chain):
            times = self._hits.get(block_hash)
            if times is None:
                times = self._hits[block_hash] = deque(maxlen=self.hot_hits)
            times.append(now)
            if (hot == i and len(times) >= self.hot_hits
                    and now - times[0] <= self.window_s):
                hot += 1
        if any(h not in self._pins for h in chain[:hot]):
            self._hot.append(chain[:hot])
        if len(self._hits) > 2 * self.pool.num_blocks:
            self._prune(now)

    def _prune(self, now: float) -> None:
        """Forget counts that can no longer make a block hot soon (amortized O(1))."""
        self._hits = {h: t for h, t in self._hits.items()
                      if h in self.pool.cached and now - t[-1] <= self.window_s}

    # --- room -------------------------------------------------------------------------

    def yield_to(self, held: Sequence[KVCacheBlock], hits: Sequence[KVCacheBlock],
                 num_new_blocks: int) -> bool:
        """A request holding ``held`` (and admitted with ``hits``) needs ``num_new_blocks``
        more and the pool is short: if it could not fit even with every other request gone,
        because of pins, release pins (:meth:`make_room`). ``True`` if any pin outside the
        request's blocks was released."""
        if not self._pins:
            return False
        mine = {*held, *hits}
        outside = sum(p.block not in mine for p in self._pins.values())
        excess = len(mine) + num_new_blocks + outside - self.pool.num_blocks
        return excess > 0 and self.make_room(mine, excess) > 0

    def make_room(self, mine: Collection[KVCacheBlock], excess: int) -> int:
        """Release pins, automatic-only ones first, then soonest to expire first (deepest
        first on a tie, then pinning order; each with its descendants), until ``excess``
        pinned blocks outside ``mine`` (a request's blocks) are released or none is left.
        Returns the number released outside ``mine``."""
        order = sorted(self._pins.items(),
                       key=lambda kv: (kv[1].explicit, kv[1].expires_at, -kv[1].depth))
        freed = 0
        for block_hash, _ in order:
            if freed >= excess:
                break
            if block_hash in self._pins:
                freed += sum(p.block not in mine for p in self._release({block_hash}))
        return freed

    def held_only_by_pins(self) -> bool:
        """Whether every referenced block of the pool is referenced by one pin only."""
        return (self.pool.num_free_blocks + len(self._pins) == self.pool.num_blocks
                and all(p.block.ref_cnt == 1 for p in self._pins.values()))


def _extends(block: KVCacheBlock, parent: KVCacheBlock | None) -> bool:
    """Whether cached ``block`` follows ``parent``'s prefix (block 0 when ``parent`` is None)."""
    content = block.content
    if content is None:
        return False
    if parent is None:
        return content.parent is None
    want = parent.content
    return content.parent is want or (
        content.parent is not None and want is not None and content.parent.same_as(want))
