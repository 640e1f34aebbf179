"""The manager's side of the tiers: its lower tiers (if any) and the tokens each tier served.

:class:`Tiers` wires the offloader and onboarder to one pool and counts first admissions per
tier (``gpu`` always). The scheduler adds two steps to the manager's call sequence: before
admitting, ``onboarding``/``start_onboard``; once per step, ``take_transfers`` and
``finish_onboard``. Without lower tiers every method answers "nothing" (``finish_onboard``
and ``restore_disk`` raise ``ValueError``). Not thread-safe.

See docs/architecture.md#worker-kv-cache.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from kvmesh.contract import TIERS
from kvmesh.events.pool import CacheSnapshot

from .block import Extra, KVCacheBlock
from .block_pool import BlockPool
from .offload import DiskEntry, Offloader
from .onboard import Onboarder, Read
from .request import KVRequest
from .stats import TierCounters
from .tenants import TenantLedger
from .transfers import Lost, Transfer

TIER_NAMES = TIERS


class Tiers:
    """The lower tiers below one pool and the per-tier hit tokens of its first admissions.

    ``update_hashes(req)`` extends ``req.block_hashes`` over its full blocks and
    ``extra(req, i)`` gives block ``i``'s extra keys: the manager's own hashing, so a
    lower-tier hit is verified exactly like a device hit.
    """

    @staticmethod
    def check(tier: str, cpu_blocks: int, disk_blocks: int) -> None:
        """Raise ``ValueError`` unless these sizes fit below a pool of ``tier``."""
        if cpu_blocks < 0 or disk_blocks < 0:
            raise ValueError("cpu_blocks and disk_blocks must be >= 0")
        if disk_blocks and not cpu_blocks:
            raise ValueError("a disk tier needs a CPU tier (blocks spill to disk from it)")
        if cpu_blocks and tier != "gpu":
            raise ValueError("lower tiers sit below the device pool (tier='gpu')")

    def __init__(self, pool: BlockPool, block_size: int, cpu_blocks: int, disk_blocks: int, *,
                 enable_caching: bool, update_hashes: Callable[[KVRequest], None],
                 extra: Callable[[KVRequest, int], Extra]) -> None:
        self.pool = pool
        self.block_size = block_size
        self.enable_caching = enable_caching
        self._update_hashes = update_hashes
        self._extra = extra
        self.offloader = Offloader(pool, cpu_blocks, disk_blocks) if cpu_blocks else None
        self.onboards = (None if self.offloader is None
                         else Onboarder(pool, self.offloader, block_size))
        self._by_tier: dict[str, dict[str, int]] = {}  # request id -> fixed at 1st admission
        self._hit_tokens = dict.fromkeys((*TIER_NAMES, "peer"), 0)  # first admissions
        lower = () if self.offloader is None else self.offloader.tiers
        self.tenants = TenantLedger([pool.ledger, *(t.ledger for t in lower)])

    # --- onboards -----------------------------------------------------------------------

    def start_onboard(self, req: KVRequest, hits: Sequence[KVCacheBlock]) -> bool:
        """Order the copy to the device of the CPU/disk blocks continuing a waiting request's
        chain after its device ``hits``, holding the hits and fresh blocks for it
        (``Onboarder.start``). ``False``, changing nothing, when nothing below matches, no
        block is free, or the request already holds an onboard (or its onboard failed: it
        recomputes)."""
        onboards = self.onboards
        if onboards is None or not onboards.can_start(req.request_id):
            return False
        reads = self.match(req, hits)
        if not reads:
            return False
        extras = ([self._extra(req, i) for i in range(len(hits), len(hits) + len(reads))]
                  if req.has_extra_keys else None)
        return onboards.start(req.request_id, hits, reads, req.block_hashes, req.token_ids,
                              extras, req.tenant)

    def onboarding(self, request_id: str) -> bool:
        """Whether ``request_id``'s copy is in flight."""
        return self.onboards is not None and self.onboards.in_flight(request_id)

    def finish_onboard(self, request_id: str, ok: bool,
                       failed: Iterable[tuple[str, bytes]] = ()) -> None:
        """The copy of ``request_id`` ended; ``failed``: the ``(tier, block_hash)`` sources
        that could not be read (``Onboarder.finish``). ``ValueError`` if none in flight or
        without lower tiers."""
        if self.onboards is None:
            raise ValueError("no lower tiers (cpu_blocks=0)")
        self.onboards.finish(request_id, ok, failed)

    def release_holds(self, keep: str | None = None) -> int:
        """``Onboarder.release_idle``: finished holds released but ``keep``'s; how many."""
        if self.onboards is None:
            return 0
        return self.onboards.release_idle(keep)

    def match(self, req: KVRequest, hits: Sequence[KVCacheBlock]) -> list[Read]:
        """The lower-tier entries continuing ``req``'s chain after its device ``hits``, up to
        its last full block before its last token; changes nothing but ``req``'s hashes."""
        if self.onboards is None or not self.enable_caching:
            return []
        self._update_hashes(req)
        stop = min((req.num_tokens - 1) // self.block_size, len(req.block_hashes))
        return self.onboards.match(req.block_hashes, req.token_ids, hits, stop,
                                   lambda i: self._extra(req, i))

    def match_by_tier(self, req: KVRequest, hits: Sequence[KVCacheBlock],
                      num_hits: int) -> dict[str, int]:
        """Tokens held per tier: ``num_hits`` device tokens, then the lower matches."""
        out = dict.fromkeys(TIER_NAMES, 0)
        out["gpu"] = num_hits
        for tier, _ in self.match(req, hits):
            out[tier.name] += self.block_size
        return out

    # --- the request lifecycle ----------------------------------------------------------

    def check_admission(self, request_id: str) -> None:
        """Raise ``ValueError`` if ``request_id``'s onboard is in flight."""
        if self.onboards is not None:
            self.onboards.check_admission(request_id)

    def admit(self, req: KVRequest, hits: Sequence[KVCacheBlock], num_hits: int,
              peer: int = 0) -> None:
        """``req`` was admitted with ``hits`` (``num_hits`` tokens, already referenced;
        ``peer`` of them on blocks imported for it from another worker): release its hold
        and, at a first admission, fix its tokens per tier (``"peer"`` only when > 0) and
        count them for its tenant."""
        lower = {} if self.onboards is None else self.onboards.admit(req.request_id, hits)
        if not req.num_preemptions:
            by_tier = dict.fromkeys(TIER_NAMES, 0)
            by_tier.update(lower)
            by_tier["gpu"] = num_hits - sum(lower.values()) - peer
            if peer:
                by_tier["peer"] = peer
            self._by_tier[req.request_id] = by_tier
            for name, n in by_tier.items():
                self._hit_tokens[name] += n
            self.tenants.admitted(req.tenant, req.num_tokens, by_tier, self.block_size)

    def free(self, request_id: str) -> None:
        """The request is gone: forget its split, release its hold (``Onboarder.free``)."""
        self._by_tier.pop(request_id, None)
        if self.onboards is not None:
            self.onboards.free(request_id)

    def cached_tokens(self, request_id: str) -> dict[str, int]:
        """``KVCacheManager.cached_tokens_by_tier`` (a copy; zeros when unknown)."""
        return dict(self._by_tier.get(request_id) or dict.fromkeys(TIER_NAMES, 0))

    # --- the tiers' contents ------------------------------------------------------------

    def take_transfers(self) -> list[Transfer]:
        """Copy orders since the last call, oldest first (see :mod:`.transfers`)."""
        return [] if self.offloader is None else self.offloader.take_transfers()

    def copies_lost(self, lost: Iterable[Lost]) -> int:
        """The data plane could not make these copies: ``Offloader.forget_lost`` (0 without
        lower tiers)."""
        return 0 if self.offloader is None else self.offloader.forget_lost(lost)

    def restore_disk(self, entries: Iterable[DiskEntry], hash_algo: str,
                     hash_seed: str | None) -> list[bytes]:
        """Rebuild the disk tier at start from its files (``Offloader.restore_disk``);
        returns the hashes kept. ``ValueError`` without lower tiers."""
        if self.offloader is None:
            raise ValueError("no disk tier (disk_blocks=0)")
        return self.offloader.restore_disk(entries, self.block_size, hash_algo, hash_seed)

    def clear(self) -> None:
        """Drop every lower-tier entry (the pool's prefix cache was reset)."""
        if self.offloader is not None:
            self.offloader.clear()

    def add_to_snapshot(self, snap: CacheSnapshot) -> CacheSnapshot:
        """``snap`` (the pool's) with every lower-tier entry appended, tagged by its tier."""
        if self.offloader is None:
            return snap
        for tier in self.offloader.tiers:
            for entry in tier:
                snap.block_hashes.append(entry.block_hash)
                snap.parents.append(entry.parent_hash)
                snap.tiers.append(tier.name)
        return snap

    def stats(self) -> dict[str, TierCounters]:
        """Counters of each enabled tier, ``gpu`` first (see :class:`TierCounters`)."""
        pool, lower = self.pool, self.offloader
        moved = 0 if lower is None else lower.device_offloads
        out = {"gpu": TierCounters(pool.num_blocks, pool.num_cached_blocks,
                                   self._hit_tokens["gpu"], pool.evictions - moved, moved, 0)}
        for tier in () if lower is None else lower.tiers:
            out[tier.name] = TierCounters(tier.num_slots, len(tier),
                                          self._hit_tokens[tier.name], tier.evictions,
                                          tier.offloads, tier.onboard_blocks)
        return out
