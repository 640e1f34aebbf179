"""The index backend contract: what every backend stores and how each operation behaves.

Both backends (memory, redis) follow it exactly; a property test compares them with a
brute-force model. Lookup counts, per worker, the consecutive blocks from block 0 it holds.
A batch is applied all or nothing and idempotently by seq (a gap applies nothing: resync);
an orphan stored event is skipped; calls of another incarnation raise
:class:`StaleIncarnation`; a snapshot replaces the worker's entries; a live worker id is
never taken over from another address or credential (:class:`WorkerIdInUse`). Times are
the caller's milliseconds, so backends hold no clock.

See docs/architecture.md#index-backend-contract.
"""
from __future__ import annotations

import abc
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from urllib.parse import quote

from kvmesh.contract import TIER_PB, TIERS
from kvmesh.quota import Quota, Quotas

TIER_GPU, TIER_CPU, TIER_DISK = (TIER_PB[t] for t in TIERS)  # the wire's Tier values
ALL_TIERS = 0b111


def tier_bit(tier: int) -> int:
    """Bitmask of one tier; tier 0 (unspecified) means every tier."""
    return ALL_TIERS if tier == 0 else 1 << (tier - 1)


def best_tier(mask: int) -> int:
    """The fastest tier present in a non-zero bitmask."""
    return TIER_GPU if mask & 1 else TIER_CPU if mask & 2 else TIER_DISK


def namespace(model: str, block_size: int, algo: str) -> str:
    """``<model, percent-encoded>:<block_size>:<algo>``: injective and free of ``{}|``."""
    return f"{quote(model, safe='')}:{block_size}:{algo}"


class IndexUnavailable(Exception):
    """The backend cannot be reached (connection refused, timeout, loading)."""


class StaleIncarnation(Exception):
    """A worker call carried an incarnation other than the one that registered last: it
    comes from a process that is gone (or was replaced); nothing was changed."""

    def __init__(self, worker_id: str, incarnation: int) -> None:
        super().__init__(f"stale incarnation {incarnation} of worker {worker_id!r}: another "
                         "process registered this worker id since; register again")
        self.worker_id = worker_id
        self.incarnation = incarnation


class WorkerIdInUse(Exception):
    """A registration for a worker id a live worker holds from another address or
    credential; nothing was changed."""

    def __init__(self, worker_id: str) -> None:
        super().__init__(f"worker id {worker_id!r} is held by a live worker registered from "
                         "another address or credential; retry once it stops heartbeating")
        self.worker_id = worker_id


@dataclass(frozen=True, slots=True)
class BlockCap:
    """How many blocks one worker may have indexed: ``per_pool`` times the ``total_blocks``
    + ``tier_blocks`` (device pool and lower tiers) its last Register/Heartbeat reported, and
    at least ``floor``. ``per_pool == 0``: no cap.
    A real worker holds at most its pool, so only a lying or buggy one reaches the cap."""

    per_pool: int = 0
    floor: int = 0

    def limit(self, total_blocks: int) -> int | None:
        return max(self.per_pool * total_blocks, self.floor) if self.per_pool else None


class OverCap(Exception):
    """A worker's events or snapshot would index more blocks than its :class:`BlockCap`.

    Checked before any work: a snapshot of more distinct blocks than the cap, or a batch
    for which (indexed blocks + hashes stored - hashes removed) exceeds it, changes nothing
    (``dropped`` False). That estimate can only overcount (re-stores, removals of blocks
    not indexed); a batch that passes it yet ends over the cap (impossible today: kept as a
    backstop) drops every entry of the worker and resets its seq to 0 (``dropped``)."""

    def __init__(self, worker_id: str, cap: int, dropped: bool = False) -> None:
        what = ("its entries were dropped: resync with a snapshot" if dropped
                else "refused, nothing changed")
        super().__init__(f"worker {worker_id!r} would index more than {cap} blocks, its cap "
                         f"(a multiple of the total_blocks it reports); {what}")
        self.worker_id = worker_id
        self.cap = cap


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """A worker's last reported load. The three costs are measured on the worker, in
    microseconds (0.0: not measured yet): recomputing one prompt token, and copying one
    block from the CPU / disk tier back to the device (``service.credits`` turns them into
    the credit a lower-tier match earns on that worker)."""

    running: int = 0
    waiting: int = 0
    queued_prefill_tokens: int = 0
    free_blocks: int = 0
    total_blocks: int = 0
    decode_tokens: int = 0
    prefill_us_per_token: float = 0.0
    onboard_us_per_block_cpu: float = 0.0
    onboard_us_per_block_disk: float = 0.0
    tier_blocks: int = 0  # capacity of the CPU and disk tiers (the block cap counts them)
    free_empty_blocks: int = 0  # free blocks holding no hash (service.policy.room)
    fetch_us_per_block: float = 0.0  # pulling one block from a peer (service.policy.fetch)
    fetch_us_per_call: float = 0.0   # the fixed cost of one peer fetch
    peer_fetch: bool = False  # the worker serves and receives peer blocks


@dataclass(slots=True)
class WorkerRecord:
    """A registered worker. ``last_seq``: last event seq the index applied;
    ``reported_seq``: the worker's own last seq as of its latest heartbeat;
    ``incarnation``: the process that registered it (see the module rules);
    ``credential``: ``service.auth.fingerprint`` of the token it registered with ("" for
    none), never the token itself."""

    worker_id: str
    ns: str
    address: str
    model: str
    block_size: int
    algo: str
    load: WorkerLoad = field(default_factory=WorkerLoad)
    last_seq: int = 0
    reported_seq: int = 0
    heartbeat_ms: int = 0
    registered_ms: int = 0
    indexed_blocks: int = -1  # filled by ``workers(with_blocks=True)``; -1: not counted
    incarnation: int = 0
    credential: str = ""


# The index's form of a block event: what ``service.validate`` makes of a published
# ``index_pb2.KvEvent`` (hashes checked, tier an int, parent ``b""`` at block 0).
@dataclass(frozen=True, slots=True)
class IndexStored:
    hashes: tuple[bytes, ...]
    parent: bytes = b""
    tier: int = TIER_GPU


@dataclass(frozen=True, slots=True)
class IndexRemoved:
    hashes: tuple[bytes, ...]
    tier: int = 0


@dataclass(frozen=True, slots=True)
class IndexCleared:
    pass


@dataclass(frozen=True, slots=True)
class IndexEvent:
    seq: int
    op: IndexStored | IndexRemoved | IndexCleared


@dataclass(frozen=True, slots=True)
class BlockMatch:
    """How many consecutive blocks from block 0 a worker holds, split by tier."""

    blocks: int = 0
    gpu: int = 0
    cpu: int = 0
    disk: int = 0

    @property
    def tier(self) -> int:
        """The slowest tier among the matched blocks (0 when nothing matched)."""
        if not self.blocks:
            return 0
        return TIER_DISK if self.disk else TIER_CPU if self.cpu else TIER_GPU


class ApplyStatus(Enum):
    OK = "ok"
    DUPLICATE = "duplicate"
    GAP = "gap"
    UNKNOWN_WORKER = "unknown_worker"


@dataclass(frozen=True, slots=True)
class ApplyResult:
    status: ApplyStatus
    applied: int
    last_seq: int


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    known: bool
    last_seq: int = 0             # last event seq the index applied
    prev_reported_seq: int = 0    # the worker's last seq as of its previous heartbeat


def resolve_snapshot(blocks: Sequence[IndexStored]) -> dict[bytes, tuple[bytes, int]]:
    """hash -> (root, tier mask) for the blocks of a snapshot that reach a chain start.

    A hash's parent is the one given where it first appears; cycles and chains whose first
    parent is not in the snapshot are dropped.
    """
    parent_of: dict[bytes, bytes] = {}
    masks: dict[bytes, int] = {}
    for st in blocks:
        prev = st.parent
        bit = tier_bit(st.tier)
        for h in st.hashes:
            parent_of.setdefault(h, prev)
            masks[h] = masks.get(h, 0) | bit
            prev = h
    roots: dict[bytes, bytes | None] = {}
    for h in parent_of:
        path: list[bytes] = []
        seen: set[bytes] = set()
        cur: bytes = h
        root: bytes | None = None
        while True:
            if cur in roots:
                root = roots[cur]
                break
            if cur in seen or cur not in parent_of:
                break  # a cycle, or a parent outside the snapshot: orphans
            seen.add(cur)
            path.append(cur)
            p = parent_of[cur]
            if p == b"":
                root = cur
                break
            cur = p
        for node in path:
            roots[node] = root
    return {h: (r, masks[h]) for h, r in roots.items() if r is not None}


class IndexBackend(abc.ABC):
    """Async index store. Methods raise :class:`IndexUnavailable` when the store is down."""

    name: str = "?"

    @abc.abstractmethod
    async def register(self, record: WorkerRecord, live_after_ms: int | None = None) -> bool:
        """Create ``record`` (last seq 0), dropping earlier state of its worker id.
        Returns True when earlier state existed. Raises WorkerIdInUse (changing nothing)
        when a record of the id heartbeated after ``live_after_ms`` from another address or
        credential (see the module rules)."""

    @abc.abstractmethod
    async def heartbeat(self, worker_id: str, load: WorkerLoad, reported_seq: int,
                        now_ms: int, incarnation: int = 0) -> HeartbeatResult:
        """Store load, heartbeat time and reported seq; never creates a record. Raises
        StaleIncarnation (storing nothing) when ``incarnation`` is not the record's."""

    @abc.abstractmethod
    async def apply_events(self, worker_id: str, events: Sequence[IndexEvent],
                           incarnation: int = 0, cap: BlockCap = BlockCap()) -> ApplyResult:
        """Apply one batch atomically (see the module rules). ``events`` have consecutive
        seqs (the caller validates). Raises StaleIncarnation (applying nothing) when
        ``incarnation`` is not the record's, and OverCap when the worker ends the batch
        holding more than ``cap`` allows (its entries are then all dropped, seq 0)."""

    @abc.abstractmethod
    async def sync_worker(self, worker_id: str, seq: int, blocks: Sequence[IndexStored],
                          incarnation: int = 0, cap: BlockCap = BlockCap()) -> int | None:
        """Replace the worker's entries with a snapshot and set its last seq to ``seq``.
        Returns the number of blocks indexed, or None for an unknown worker. Raises
        StaleIncarnation or OverCap (a snapshot of more blocks than ``cap`` allows),
        changing nothing, when ``incarnation`` is not the record's."""

    @abc.abstractmethod
    async def purge_worker(self, worker_id: str, heartbeat_before_ms: int | None = None) -> bool:
        """Drop the worker's entries and record. With ``heartbeat_before_ms``, only if its
        last heartbeat is older (so a worker that just came back survives). True if purged."""

    @abc.abstractmethod
    async def lookup(self, ns: str, hashes: Sequence[bytes], now_ms: int,
                     workers: Collection[str] | None = None) -> dict[str, BlockMatch]:
        """Walk ``hashes`` (a chain from block 0) in ONE store round trip; only workers in
        ``workers`` (None: any) are considered. Workers matching no block are absent."""

    @abc.abstractmethod
    async def add_provisional(self, ns: str, hashes: Sequence[bytes], worker_id: str,
                              start: int, now_ms: int, ttl_ms: int) -> None:
        """Record ``hashes[start:]`` of the chain ``hashes`` as provisionally held by
        ``worker_id`` until ``now_ms + ttl_ms`` (other unexpired holders stay)."""

    @abc.abstractmethod
    async def workers(self, with_blocks: bool = False) -> list[WorkerRecord]:
        """Every registered worker (copies), optionally with ``indexed_blocks`` counted."""

    @abc.abstractmethod
    async def get_worker(self, worker_id: str) -> WorkerRecord | None:
        """One worker's record (a copy), or None."""

    @abc.abstractmethod
    async def quotas(self) -> Quotas:
        """The tenant quotas every replica serves (``Quotas()`` when none is set)."""

    @abc.abstractmethod
    async def set_quota(self, tenant: str, quota: Quota | None) -> Quotas:
        """Set ``tenant``'s quota (``kvmesh.quota.ALL_TENANTS``: the default), or remove it
        when ``quota`` is None or empty; returns the quotas after. One tenant is one atomic
        write, so replicas setting different tenants at once lose neither. The caller
        validates (tenant name, the per-tenant limit)."""

    async def sweep(self) -> int:
        """Reclaim the memory of entries that were dropped logically (the redis backend
        drops a worker's entries by retiring its handle and deletes them here, a bounded
        step per call; the service's janitor calls it). Returns the entries deleted;
        lookups never see dropped entries, swept or not."""
        return 0

    async def ping(self) -> None:
        """Raise IndexUnavailable when the store cannot be reached."""
        return None

    async def close(self) -> None:
        """Release connections; the backend is unusable afterwards."""
        return None


def copy_record(record: WorkerRecord, **changes: object) -> WorkerRecord:
    """A detached copy of ``record`` (records are mutable; backends never share them)."""
    return replace(record, **changes)  # type: ignore[arg-type]
