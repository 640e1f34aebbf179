"""The KV cache manager: block tables of running requests over one prefix-caching pool.

Per step (vLLM v1's shape): a waiting request calls ``get_computed_blocks`` then, with
nothing allocated in between, ``allocate_slots``; a running one ``allocate_slots`` for its
new tokens; ``None`` means no room and changed nothing; a finished one ``free``.
Invariant: a cached block's KV is written, or is being written by the step in progress;
every step runs inside :meth:`KVCacheManager.step`, which uncaches (and reports removed)
the blocks a failed step cached. Lower tiers, the eviction order and pins hang off the
same calls and are off by default. Not thread-safe: the engine's loop calls everything.

See docs/architecture.md#worker-kv-cache.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager

from kvmesh.contract import ALGOS, DEFAULT_ALGO
from kvmesh.events.pool import CacheSnapshot, PoolEvent
from kvmesh.hashing import extend_block_hashes, extra_keys
from kvmesh.quota import Quotas

from .block import Extra, KVCacheBlock
from .block_pool import BlockPool
from .offload import DiskEntry
from .peer_import import PeerImports
from .pins import Pinned, PinTable
from .request import KVRequest
from .stats import Admissions, CacheStats, TierCounters
from .tenant_stats import TenantCounts
from .tiered import TIER_NAMES, Tiers
from .transfers import Lost, Transfer

__all__ = ["TIER_NAMES", "KVCacheManager"]  # TIER_NAMES: defined here before tiered.py


class KVCacheManager:
    """Allocates, caches and frees the KV blocks of requests (vLLM v1 prefix caching).

    Lookups walk a request's hash chain from block 0 and stop at the first miss; a hit is
    only accepted when the block's stored tokens (and whole prefix) equal the request's, and
    at most ``num_tokens - 1`` tokens come from cache so the last token is always computed.
    """

    def __init__(self, num_blocks: int, block_size: int, *, hash_algo: str = DEFAULT_ALGO,
                 hash_seed: str | None = None, enable_caching: bool = True,
                 tier: str = "gpu", cpu_blocks: int = 0, disk_blocks: int = 0,
                 eviction: str = "lru", auto_pin: bool = False,
                 pin_cap: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if hash_algo not in ALGOS:
            raise ValueError(f"unknown hash algo {hash_algo!r}; valid: {', '.join(ALGOS)}")
        Tiers.check(tier, cpu_blocks, disk_blocks)
        self.block_size = block_size
        self.hash_algo = hash_algo
        self.hash_seed = hash_seed
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks, enable_caching=enable_caching, tier=tier,
                              eviction=eviction)
        self._layered = eviction == "layered"
        self.pins = PinTable(self.pool, pin_cap, auto=auto_pin and enable_caching, clock=clock)
        self._blocks: dict[str, list[KVCacheBlock]] = {}  # request id -> block table
        self._num_cached: dict[str, int] = {}  # request id -> leading blocks already cached
        self._first = Admissions()      # first admissions: the hit rate's counters
        self._preempted = Admissions()  # re-admissions after preemption, kept apart
        self._unwritten: list[KVCacheBlock] | None = None  # cached by the open step
        self._tiers = Tiers(self.pool, block_size, cpu_blocks, disk_blocks,
                            enable_caching=enable_caching, update_hashes=self._update_hashes,
                            extra=self._extra)
        self.offloader = self._tiers.offloader  # None without lower tiers
        self._onboards = self._tiers.onboards
        self.peer = PeerImports(self)  # blocks pulled from other workers
        self.tenants = self._tiers.tenants  # every tier's owners and the admissions per tenant

    @property
    def quotas(self) -> Quotas:
        """The quotas in force; ``Quotas()`` (the start): every tier evicts as vLLM's does."""
        return self.pool.ledger.quotas

    def set_quotas(self, quotas: Quotas) -> None:
        """Apply per-tenant quotas (engine thread; :mod:`kvmesh.quota`). Takes effect at the
        next eviction; nothing is evicted by the call itself (see quota_queue.py)."""
        self.tenants.set_quotas(quotas)
        self.pool.set_quotas(quotas)

    def tenant_stats(self) -> dict[str, TenantCounts]:
        """Per-tenant counters, every tenant seen (see :mod:`.tenant_stats`, tenants.py)."""
        return self.tenants.stats()

    # --- sizing -----------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_free_empty_blocks(self) -> int:
        """Free device blocks that hold no hash (the router's room check)."""
        return self.pool.num_free_empty_blocks

    @property
    def usage(self) -> float:
        return self.pool.usage

    def num_blocks_needed(self, num_tokens: int) -> int:
        """Blocks a sequence of ``num_tokens`` tokens occupies."""
        return -(-num_tokens // self.block_size)

    def can_ever_fit(self, num_tokens: int) -> bool:
        """Whether a sequence of ``num_tokens`` (prompt + max new tokens) fits in an otherwise
        empty pool; the engine refuses requests for which this is ``False``."""
        return self.num_blocks_needed(num_tokens) <= self.num_blocks

    # --- hashing ----------------------------------------------------------------------

    def _update_hashes(self, req: KVRequest) -> None:
        if len(req.block_hashes) < len(req.token_ids) // self.block_size:
            extend_block_hashes(req.block_hashes, req.token_ids, self.block_size,
                                algo=self.hash_algo, seed=self.hash_seed, salt=req.salt,
                                lora=req.lora, mm=req.mm)

    def _extra(self, req: KVRequest, index: int) -> Extra:
        if not req.has_extra_keys:
            return None
        start = index * self.block_size
        return extra_keys(start, start + self.block_size, salt=req.salt, lora=req.lora,
                          mm=req.mm)

    # --- the scheduler's API ----------------------------------------------------------

    def get_computed_blocks(self, req: KVRequest) -> tuple[list[KVCacheBlock], int]:
        """The longest verified cached prefix of a waiting request: its blocks and token count.

        Walks the chain from block 0 and stops at the first miss; never returns more than
        ``req.num_tokens - 1`` tokens. Changes nothing (the blocks are not referenced until
        :meth:`allocate_slots`).
        """
        if not self.enable_caching:
            return [], 0
        self._update_hashes(req)
        bs = self.block_size
        max_blocks = min((req.num_tokens - 1) // bs, len(req.block_hashes))
        hits: list[KVCacheBlock] = []
        parent: KVCacheBlock | None = None
        for i in range(max_blocks):
            block = self.pool.get_cached_block(req.block_hashes[i],
                                               req.token_ids[i * bs:(i + 1) * bs],
                                               parent, self._extra(req, i))
            if block is None:
                break
            hits.append(block)
            parent = block
        return hits, len(hits) * bs

    # --- lower tiers (cpu_blocks > 0; see tiered.py) ---------------------------------

    def start_onboard(self, req: KVRequest, hits: Sequence[KVCacheBlock]) -> bool:
        """:meth:`Tiers.start_onboard` (``hits`` from :meth:`get_computed_blocks`);
        ``False``, changing nothing, for a request that has a block table."""
        return req.request_id not in self._blocks and self._tiers.start_onboard(req, hits)

    def onboarding(self, req: KVRequest) -> bool:
        """Whether this request's copy is in flight (it must not be admitted yet)."""
        return self._tiers.onboarding(req.request_id)

    def finish_onboard(self, request_id: str, ok: bool,
                       failed: Iterable[tuple[str, bytes]] = ()) -> None:
        """:meth:`Tiers.finish_onboard`: the copy of ``request_id`` ended."""
        self._tiers.finish_onboard(request_id, ok, failed)

    def release_holds(self, keep: KVRequest | None = None) -> int:
        """Release finished onboards' holds but ``keep``'s (the scheduler's blocked head)."""
        return self._tiers.release_holds(None if keep is None else keep.request_id)

    def keep_warm(self, req: KVRequest) -> dict[str, int]:
        """The device blocks ``req`` will hit move to the most recently used end of the free
        queue (``BlockPool.refresh``): a request waiting in a queue must not lose its prefix
        to the admissions ahead of it while other cached blocks nobody waits for remain.
        Returns :meth:`match_by_tier` of the same lookup (a queued request needs both, and
        the walk is the cost)."""
        hits, n = self.get_computed_blocks(req)
        self.pool.refresh(hits)
        return self._tiers.match_by_tier(req, hits, n)

    def match_by_tier(self, req: KVRequest) -> dict[str, int]:
        """Tokens of the longest verified prefix held now, per tier; changes nothing."""
        hits, n = self.get_computed_blocks(req)
        return self._tiers.match_by_tier(req, hits, n)

    def take_transfers(self) -> list[Transfer]:
        """Copy orders since the last call, oldest first (see :mod:`.transfers`)."""
        return self._tiers.take_transfers()

    def copies_lost(self, lost: Iterable[Lost]) -> int:
        """The data plane could not make these copies: their lower entries are dropped
        (``PoolRemoved``) before anything spills, announces or onboards them; how many."""
        return self._tiers.copies_lost(lost)

    def restore_disk(self, entries: Iterable[DiskEntry]) -> list[bytes]:
        """:meth:`Tiers.restore_disk`: the disk tier rebuilt at start; the hashes kept."""
        return self._tiers.restore_disk(entries, self.hash_algo, self.hash_seed)

    def allocate_slots(self, req: KVRequest, num_new_tokens: int,
                       new_computed_blocks: Sequence[KVCacheBlock] = (),
                       num_new_computed_tokens: int = 0) -> list[KVCacheBlock] | None:
        """Make room for ``num_new_tokens`` more tokens after ``req.num_computed_tokens`` (plus
        the cache hits, for a request being admitted); return the newly allocated blocks.

        Returns ``None``, changing nothing, when the pool has too few free blocks (cache hits
        that are free count against them, as touching takes them off the free queue); pins
        that the request could never fit beside are released first (``PinTable.yield_to``).
        Otherwise: hits are touched, new blocks popped from the free queue's head (evicting
        what they cached), and every block the scheduled tokens fill is cached at once.
        Raises ``ValueError`` on inconsistent arguments (hits for a request that already
        has blocks, a token count not matching the hits, stale hits).
        """
        if num_new_tokens < 1:
            raise ValueError(f"num_new_tokens must be >= 1, got {num_new_tokens}")
        hits = list(new_computed_blocks)
        table = self._blocks.get(req.request_id)
        if table is None:
            self._tiers.check_admission(req.request_id)
        if hits:
            self._check_hits(req, table, hits, num_new_computed_tokens)
        elif num_new_computed_tokens:
            raise ValueError("num_new_computed_tokens given without the computed blocks")
        num_computed = req.num_computed_tokens + num_new_computed_tokens
        held = len(table) if table is not None else 0
        num_new_blocks = max(0, self.num_blocks_needed(num_computed + num_new_tokens)
                             - held - len(hits))
        taken_from_free = sum(1 for b in hits if b.ref_cnt == 0)
        if num_new_blocks + taken_from_free > self.pool.num_free_blocks:
            if not self.pins.yield_to(table or (), hits, num_new_blocks):
                return None
            taken_from_free = sum(1 for b in hits if b.ref_cnt == 0)
            if num_new_blocks + taken_from_free > self.pool.num_free_blocks:
                return None

        admission = table is None
        if admission:
            table = self._blocks[req.request_id] = []
            self._num_cached[req.request_id] = len(hits)
        if hits:
            self.pool.touch(hits)
            table.extend(hits)
            self._note_hits(req, hits)
        new_blocks = (self.pool.get_new_blocks(num_new_blocks, req.tenant) if num_new_blocks
                      else [])
        table.extend(new_blocks)
        if admission:
            self._tiers.admit(req, hits, num_new_computed_tokens,
                              self.peer.admit(req.request_id, hits))
            self._record(req, num_new_computed_tokens)
        if self.enable_caching:
            self._cache_blocks(req, table, min(num_computed + num_new_tokens, req.num_tokens))
        return new_blocks

    def _check_hits(self, req: KVRequest, table: list[KVCacheBlock] | None,
                    hits: list[KVCacheBlock], num_new_computed_tokens: int) -> None:
        if table or req.num_computed_tokens:
            raise ValueError(f"request {req.request_id!r} already has blocks; cache hits "
                             "are only added at admission")
        if num_new_computed_tokens != len(hits) * self.block_size:
            raise ValueError(f"{len(hits)} computed blocks are {len(hits) * self.block_size} "
                             f"tokens, not {num_new_computed_tokens}")
        self._update_hashes(req)
        for i, block in enumerate(hits):
            if i >= len(req.block_hashes) or block.block_hash != req.block_hashes[i]:
                raise ValueError("stale cache hits: call allocate_slots right after "
                                 "get_computed_blocks")

    def _cache_blocks(self, req: KVRequest, table: list[KVCacheBlock], num_tokens: int) -> None:
        """Cache the request's blocks that ``num_tokens`` tokens fill and that are not yet."""
        num_full = num_tokens // self.block_size
        num_cached = self._num_cached[req.request_id]
        if num_full <= num_cached:
            return
        self._update_hashes(req)
        extras = ([self._extra(req, i) for i in range(num_cached, num_full)]
                  if req.has_extra_keys else None)
        self.pool.cache_full_blocks(table, req.block_hashes, req.token_ids, num_cached,
                                    num_full, self.block_size, extras, req.tenant)
        self._num_cached[req.request_id] = num_full
        if self._layered:
            prompt = req.num_prompt_tokens
            for i in range(num_cached, num_full):
                table[i].decoded = prompt is not None and (i + 1) * self.block_size > prompt
        if self._unwritten is not None:
            self._unwritten.extend(table[num_cached:num_full])

    @contextmanager
    def step(self) -> Iterator[None]:
        """Scope of one engine step: schedule, then write the scheduled KV.

        On a normal exit the blocks cached inside are written. If the body raises, every
        block cached inside is uncached (``BlockPool.uncache_blocks``: a ``PoolRemoved``
        for each hash no written block still holds) and the exception propagates; the
        caller must then free every request scheduled in the step. Not reentrant.
        """
        if self._unwritten is not None:
            raise RuntimeError("a step is already open")
        self.pins.tick(self.pins.clock())
        self._unwritten = []
        self.pool.step_no += 1
        try:
            yield
        except BaseException:
            self.pool.uncache_blocks(self._unwritten)
            raise
        else:
            self.pool.written_through = self.pool.step_no
        finally:
            self._unwritten = None

    def _record(self, req: KVRequest, num_hits: int) -> None:
        counts = self._preempted if req.num_preemptions else self._first
        counts.add(req.num_tokens, num_hits)

    def free(self, req: KVRequest) -> None:
        """Release the request's blocks, last block first, so the tail of its chain is
        evicted before its (more shareable) head, and its hold (at ``finish_onboard`` if a
        copy is in flight). Freeing an unknown request is a no-op."""
        self._release_table(req)
        self._tiers.free(req.request_id)
        self.peer.forget(req.request_id)

    def _release_table(self, req: KVRequest) -> None:
        table = self._blocks.pop(req.request_id, None)
        self._num_cached.pop(req.request_id, None)
        if table:
            self.pool.free_blocks(reversed(table))

    def preempt(self, req: KVRequest) -> None:
        """Preempt by recompute: free the blocks, reset progress, count the preemption. The
        request goes back to waiting and re-enters through :meth:`get_computed_blocks`
        (its own freed blocks are likely still cached)."""
        self._release_table(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1

    def get_block_ids(self, req: KVRequest) -> list[int]:
        """The request's block table (block ids in token order)."""
        return [b.block_id for b in self._blocks.get(req.request_id, ())]

    def reset_prefix_cache(self) -> bool:
        """Drop all cached hashes, on every tier, and all pins (emits ``PoolCleared``;
        disk files get ``Drop`` orders); ``False``, changing nothing, while any request or hold
        has blocks."""
        if not self.pins.held_only_by_pins():
            return False
        self.pins.release_all()
        if not self.pool.reset_prefix_cache():
            return False
        self._tiers.clear()
        return True

    # --- pins -------------------------------------------------------------------------

    def pin(self, block_hashes: Sequence[bytes], ttl_s: float) -> Pinned:
        """Pin the chain ``block_hashes`` (from block 0) on the device blocks holding it, as
        far as the pool holds it and the pin cap allows (displacing automatic pins), for
        ``ttl_s`` seconds refreshed by each admission hitting it; blocks already pinned are
        refreshed. Returns the chain's blocks pinned now (0 with caching off) and whether
        the cap cut it short (``Pinned.capped``)."""
        if not self.enable_caching:
            return Pinned(0, len(block_hashes))
        return self.pins.pin(list(block_hashes), ttl_s, self.pins.clock())

    def pin_when_computed(self, req: KVRequest, ttl_s: float) -> None:
        """Pin ``req``'s prompt chain (its full blocks) at the first step after it has been
        computed (a warm-up request); dropped if that takes longer than ``ttl_s``."""
        if not self.enable_caching:
            return
        self._update_hashes(req)
        prompt = req.num_tokens if req.num_prompt_tokens is None else req.num_prompt_tokens
        num_full = prompt // self.block_size
        self.pins.defer(req, req.block_hashes[:num_full], num_full * self.block_size, ttl_s,
                        self.pins.clock())

    def unpin(self, block_hashes: Sequence[bytes]) -> int:
        """Release the pins on ``block_hashes`` and on their descendants; returns the number
        of blocks unpinned."""
        return self.pins.unpin(block_hashes)

    def expire_pins(self, now: float | None = None) -> int:
        """The pins' periodic work (run by :meth:`step`): release pins expired at ``now``
        (default: the clock), then take the due automatic and deferred pins. Returns the
        number of blocks released."""
        return self.pins.tick(self.pins.clock() if now is None else now)

    @property
    def num_pinned_blocks(self) -> int:
        return len(self.pins)

    def _note_hits(self, req: KVRequest, hits: list[KVCacheBlock]) -> None:
        """An admission's hits: a hit inside the prompt makes a block a prefill block (it is
        shared), and the pins see the use."""
        if self._layered:
            prompt = req.num_prompt_tokens
            for i, block in enumerate(hits):
                if prompt is None or (i + 1) * self.block_size <= prompt:
                    block.decoded = False
        if self.pins.watching:
            self.pins.note_hits(hits, self.pins.clock(), first=req.num_preemptions == 0)

    # --- reporting --------------------------------------------------------------------

    def take_events(self) -> list[PoolEvent]:
        """KV events since the last call, oldest first (sequence numbers from 1, no gaps
        unless :attr:`events_dropped` grew in between)."""
        return self.pool.take_events()

    @property
    def events_dropped(self) -> int:
        """Events discarded unread (cumulative): the pool keeps at most
        ``pool.max_pending_blocks`` blocks' worth of untaken events and drops the whole
        backlog past it, so memory stays bounded when nobody takes them. A reader that sees
        this grow since its last look missed events: it must resync from
        :meth:`cached_block_hashes` (valid as of its ``seq``) and keep only later events."""
        return self.pool.events_dropped

    def cached_block_hashes(self) -> CacheSnapshot:
        """Every hash held, on every tier (``tiers[i]`` says where; a hash on two tiers is
        listed twice), and the last event seq it reflects (for a full resync with the
        metadata service)."""
        return self._tiers.add_to_snapshot(self.pool.snapshot())

    def cached_tokens_by_tier(self, req: KVRequest) -> dict[str, int]:
        """Tokens of ``req`` served from each tier (``gpu``, ``cpu``, ``disk``, and ``peer``
        when blocks imported for it from another worker were hit), fixed at its first
        admission (onboarded blocks count for the tier they came from); zeros for a request
        not admitted yet or freed."""
        return self._tiers.cached_tokens(req.request_id)

    def tier_stats(self) -> dict[str, TierCounters]:
        """Counters of each enabled tier (see :class:`TierCounters`)."""
        return self._tiers.stats()

    @property
    def stats(self) -> CacheStats:
        return CacheStats.of(self.pool, self._first, self._preempted)
