"""Onboard: a waiting request's chain copied back from the lower tiers into device blocks.

One onboard per admission at most: ``start`` holds the device hits and fresh (uncached)
device blocks for the request and marks the lower entries read; ``finish`` caches the fresh
blocks on success or frees them uncached and drops the failed entries (the request then
recomputes); ``admit`` releases the hold. Blocks a copy writes are never handed out, nor
hit, before the copy ends, even if the request was aborted meanwhile. An onboarded block is
charged to the owner of the entry it was copied from (it keeps its owner), not to the
request that brought it back.

See docs/architecture.md#worker-kv-cache.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .block import Extra, KVCacheBlock
from .block_pool import BlockPool
from .lower_tier import LowerTier, TierEntry
from .offload import Offloader
from .transfers import Onboard

Read = tuple[LowerTier, TierEntry]


@dataclass(eq=False, slots=True)
class Hold:
    """References a request keeps on device blocks between ``start`` and admission."""

    request_id: str
    blocks: list[KVCacheBlock]      # the device hits, then the copies' destinations
    num_hits: int
    reads: list[Read]               # the copies' sources, in the destinations' order
    block_hashes: list[bytes]       # the chain through the last destination
    token_ids: list[int]            # the tokens through the last destination
    extra_keys: list[Extra] | None  # the destinations' extra keys (None: none)
    in_flight: bool = True
    freed: bool = False             # the request was freed while the copy was in flight


class Onboarder:
    """The holds of one manager's requests."""

    def __init__(self, pool: BlockPool, offloader: Offloader, block_size: int) -> None:
        self.pool = pool
        self.offloader = offloader
        self.block_size = block_size
        self.holds: dict[str, Hold] = {}
        self._no_retry: set[str] = set()  # requests whose onboard failed: they recompute

    def can_start(self, request_id: str) -> bool:
        return request_id not in self.holds and request_id not in self._no_retry

    def in_flight(self, request_id: str) -> bool:
        hold = self.holds.get(request_id)
        return hold is not None and hold.in_flight

    def match(self, block_hashes: Sequence[bytes], token_ids: Sequence[int],
              hits: Sequence[KVCacheBlock], stop: int,
              extra_of: Callable[[int], Extra]) -> list[Read]:
        """The lower-tier entries continuing a chain after its device ``hits``, up to block
        ``stop``: each next block looked up in the CPU tier, then on disk, its content
        verified against the previous match. Changes nothing."""
        for i, block in enumerate(hits):
            if i >= len(block_hashes) or block.block_hash != block_hashes[i]:
                raise ValueError("stale cache hits: pass get_computed_blocks' hits")
        bs = self.block_size
        parent = hits[-1].content if hits else None
        out: list[Read] = []
        for i in range(len(hits), stop):
            tokens, extra = token_ids[i * bs:(i + 1) * bs], extra_of(i)
            for tier in self.offloader.tiers:
                entry = tier.lookup(block_hashes[i], parent, tokens, extra)
                if entry is not None:
                    out.append((tier, entry))
                    parent = entry.content
                    break
            else:
                break
        return out

    def start(self, request_id: str, hits: Sequence[KVCacheBlock], reads: list[Read],
              block_hashes: Sequence[bytes], token_ids: Sequence[int],
              extra_keys: list[Extra] | None, tenant: str | None = None) -> bool:
        """Hold ``hits`` and fresh blocks for as many of ``reads`` as the free blocks allow
        (in chain order) and order their copy; the fresh blocks are an allocation of
        ``tenant`` (the request's). ``False``, changing nothing, if none fit."""
        taken = sum(1 for b in hits if b.ref_cnt == 0)
        n = min(len(reads), self.pool.num_free_blocks - taken)
        if n <= 0:
            return False
        reads = reads[:n]
        self.pool.touch(hits)
        for tier, entry in reads:
            tier.read(entry)  # first: the evictions below must not pick these
        for tier, entry in reversed(reads):
            tier.touch(entry)  # the chain's head ends most recently used, as on the device
        new = self.pool.get_new_blocks(n, tenant)
        end = len(hits) + n
        self.holds[request_id] = Hold(
            request_id, [*hits, *new], len(hits), reads, list(block_hashes[:end]),
            list(token_ids[:end * self.block_size]),
            None if extra_keys is None else extra_keys[:n])
        cpu = self.offloader.cpu
        self.offloader.order(Onboard(request_id, tuple(
            (tier.name, entry.slot if tier is cpu else entry.block_hash, block.block_id)
            for (tier, entry), block in zip(reads, new, strict=True))))
        return True

    def finish(self, request_id: str, ok: bool,
               failed: Iterable[tuple[str, bytes]] = ()) -> None:
        """The copy of ``request_id`` ended (see the module docstring). Raises
        ``ValueError`` if no onboard of it is in flight."""
        hold = self.holds.get(request_id)
        if hold is None or not hold.in_flight:
            raise ValueError(f"no onboard of request {request_id!r} is in flight")
        hold.in_flight = False
        for tier, entry in hold.reads:
            self.offloader.release(tier, entry)
        # A failed step may have uncached a hit (cached by a batch-mate in that step): its
        # KV was never written, so the copies cannot hang from it.
        ok = ok and all(b.block_hash == hold.block_hashes[i]
                        for i, b in enumerate(hold.blocks[:hold.num_hits]))
        if ok:
            self.pool.cache_full_blocks(hold.blocks, hold.block_hashes, hold.token_ids,
                                        hold.num_hits, len(hold.blocks), self.block_size,
                                        hold.extra_keys, [e.owner for _, e in hold.reads])
            for (tier, entry), block in zip(hold.reads, hold.blocks[hold.num_hits:],
                                            strict=True):
                block.decoded = entry.decoded  # the pool caches without a class: carry it
                tier.onboard_blocks += 1
        else:
            bad = set(failed)
            for tier, entry in hold.reads:
                if (tier.name, entry.block_hash) in bad:
                    self.offloader.drop(tier, entry)
            if not hold.freed:
                self._no_retry.add(request_id)
        if hold.freed or not ok:
            self._release(hold)

    def admit(self, request_id: str, hits: Sequence[KVCacheBlock]) -> dict[str, int]:
        """The request was admitted with ``hits`` (already referenced): release its hold.
        Returns the tokens its onboard contributed to ``hits``, per lower tier."""
        out = {tier.name: 0 for tier in self.offloader.tiers}
        hold = self.holds.get(request_id)
        if hold is None:
            return out
        assert not hold.in_flight, "check_admission first"
        for i in range(hold.num_hits, min(len(hits), len(hold.blocks))):
            if hits[i] is not hold.blocks[i]:
                break
            out[hold.reads[i - hold.num_hits][0].name] += self.block_size
        self._release(hold)
        return out

    def check_admission(self, request_id: str) -> None:
        """Raise ``ValueError`` if ``request_id``'s onboard is in flight."""
        if self.in_flight(request_id):
            raise ValueError(f"request {request_id!r} cannot be admitted: its onboard is "
                             "in flight")

    def free(self, request_id: str) -> None:
        """The request is gone: release its hold now, or at ``finish`` if in flight."""
        self._no_retry.discard(request_id)
        hold = self.holds.get(request_id)
        if hold is None:
            return
        if hold.in_flight:
            hold.freed = True
        else:
            self._release(hold)

    def release_idle(self, keep: str | None = None) -> int:
        """Release every finished hold but ``keep``'s (a blocked queue head must not wait
        on blocks held for requests behind it); returns how many. Their blocks stay
        cached, so those requests mostly hit them on the device later."""
        idle = [h for h in self.holds.values() if not h.in_flight and h.request_id != keep]
        for hold in idle:
            self._release(hold)
        return len(idle)

    def _release(self, hold: Hold) -> None:
        del self.holds[hold.request_id]
        self.pool.free_blocks(reversed(hold.blocks))
