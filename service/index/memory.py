"""In-process index backend: the reference semantics of ``base.py`` with plain dicts.

For unit tests and single-node embedding. Every method body runs without awaiting, so on one
event loop each call is atomic, exactly like a Redis Lua script. Not shared between
processes: service replicas need the redis backend.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence

from kvmesh.quota import Quota, Quotas
from service.index.base import (
    TIER_GPU,
    ApplyResult,
    ApplyStatus,
    BlockCap,
    BlockMatch,
    HeartbeatResult,
    IndexBackend,
    IndexCleared,
    IndexEvent,
    IndexRemoved,
    IndexStored,
    OverCap,
    StaleIncarnation,
    WorkerIdInUse,
    WorkerLoad,
    WorkerRecord,
    best_tier,
    copy_record,
    resolve_snapshot,
    tier_bit,
)

_SWEEP_AT = 4096  # provisional entries per namespace before expired ones are swept


def _net_hashes(events: Sequence[IndexEvent]) -> int:
    """Hashes stored minus hashes removed by ``events`` (the cap's cheap estimate)."""
    n = 0
    for ev in events:
        op = ev.op
        if isinstance(op, IndexStored):
            n += len(op.hashes)
        elif isinstance(op, IndexRemoved):
            n -= len(op.hashes)
    return n


class MemoryBackend(IndexBackend):
    """Dict-backed index; see ``service.index.base`` for the contract."""

    name = "memory"

    def __init__(self) -> None:
        self._blocks: dict[str, dict[bytes, dict[str, int]]] = {}   # ns -> hash -> wid -> mask
        self._prov: dict[str, dict[bytes, dict[str, int]]] = {}     # ns -> hash -> wid -> exp
        self._sweep_at: dict[str, int] = {}  # ns -> provisional map size that triggers a sweep
        self._records: dict[str, WorkerRecord] = {}
        self._held: dict[str, dict[bytes, bytes]] = {}              # wid -> hash -> root
        self._quotas = Quotas()

    # --- worker state -------------------------------------------------------------------

    def _forget_all(self, wid: str) -> None:
        rec = self._records.get(wid)
        held = self._held.pop(wid, {})
        if rec is None:
            return
        blocks = self._blocks.get(rec.ns, {})
        for h in held:
            entry = blocks.get(h)
            if entry is not None:
                entry.pop(wid, None)
                if not entry:
                    del blocks[h]

    async def register(self, record: WorkerRecord, live_after_ms: int | None = None) -> bool:
        wid = record.worker_id
        old = self._records.get(wid)
        if (old is not None and live_after_ms is not None and old.heartbeat_ms > live_after_ms
                and (old.address, old.credential) != (record.address, record.credential)):
            raise WorkerIdInUse(wid)
        had = old is not None
        self._forget_all(wid)
        self._records[wid] = copy_record(record, last_seq=0, reported_seq=0, indexed_blocks=-1)
        self._held[wid] = {}
        return had

    def _current(self, worker_id: str, incarnation: int) -> WorkerRecord | None:
        """The worker's record (None: unknown); raises when ``incarnation`` is stale."""
        rec = self._records.get(worker_id)
        if rec is not None and rec.incarnation != incarnation:
            raise StaleIncarnation(worker_id, incarnation)
        return rec

    async def heartbeat(self, worker_id: str, load: WorkerLoad, reported_seq: int,
                        now_ms: int, incarnation: int = 0) -> HeartbeatResult:
        rec = self._current(worker_id, incarnation)
        if rec is None:
            return HeartbeatResult(known=False)
        prev = rec.reported_seq
        rec.load, rec.reported_seq, rec.heartbeat_ms = load, reported_seq, now_ms
        return HeartbeatResult(True, rec.last_seq, prev)

    async def purge_worker(self, worker_id: str, heartbeat_before_ms: int | None = None) -> bool:
        rec = self._records.get(worker_id)
        if rec is None:
            return False
        if heartbeat_before_ms is not None and rec.heartbeat_ms >= heartbeat_before_ms:
            return False
        self._forget_all(worker_id)
        del self._records[worker_id]
        return True

    # --- events -------------------------------------------------------------------------

    async def apply_events(self, worker_id: str, events: Sequence[IndexEvent],
                           incarnation: int = 0, cap: BlockCap = BlockCap()) -> ApplyResult:
        rec = self._current(worker_id, incarnation)
        if rec is None:
            return ApplyResult(ApplyStatus.UNKNOWN_WORKER, 0, 0)
        if not events:
            return ApplyResult(ApplyStatus.OK, 0, rec.last_seq)
        if events[-1].seq <= rec.last_seq:
            return ApplyResult(ApplyStatus.DUPLICATE, 0, rec.last_seq)
        if events[0].seq > rec.last_seq + 1:
            return ApplyResult(ApplyStatus.GAP, 0, rec.last_seq)
        new = events[max(rec.last_seq + 1 - events[0].seq, 0):]  # skip the applied overlap
        blocks = self._blocks.setdefault(rec.ns, {})
        held = self._held.setdefault(worker_id, {})
        limit = cap.limit(rec.load.total_blocks + rec.load.tier_blocks)
        if limit is not None and len(held) + _net_hashes(events) > limit:  # as redis APPLY
            raise OverCap(worker_id, limit)
        # One loop, locals bound and no call per block: at a bridge's rate this loop is
        # most of the service's CPU, and the event loop waits on it (the call is atomic).
        for ev in new:
            op = ev.op
            if isinstance(op, IndexStored):
                hs = op.hashes
                root = held.get(op.parent) if op.parent else hs[0]
                if root is None:
                    continue  # orphan: its parent is not held by this worker
                bits = tier_bit(op.tier)
                # Per hash, not bulk: dict.fromkeys/update measured slower (the per-block
                # entry dict dominates, and a temporary dict adds a second insertion).
                for h in hs:
                    held.setdefault(h, root)  # a held hash keeps the root it was stored with
                    entry = blocks.get(h)
                    if entry is None:
                        blocks[h] = {worker_id: bits}
                    else:
                        entry[worker_id] = entry.get(worker_id, 0) | bits
            elif isinstance(op, IndexRemoved):
                keep = ~tier_bit(op.tier)
                for h in op.hashes:
                    if h not in held:
                        continue
                    entry = blocks.get(h)
                    if entry is not None:
                        left = entry.get(worker_id, 0) & keep
                        if left:
                            entry[worker_id] = left
                            continue
                        entry.pop(worker_id, None)
                        if not entry:
                            del blocks[h]
                    del held[h]
            elif isinstance(op, IndexCleared):
                self._forget_all(worker_id)
                held = self._held.setdefault(worker_id, {})
        limit = cap.limit(rec.load.total_blocks + rec.load.tier_blocks)
        if limit is not None and len(held) > limit:  # as the redis APPLY script
            self._forget_all(worker_id)
            self._held[worker_id] = {}
            rec.last_seq = 0
            raise OverCap(worker_id, limit, dropped=True)
        rec.last_seq = events[-1].seq
        return ApplyResult(ApplyStatus.OK, len(new), rec.last_seq)

    async def sync_worker(self, worker_id: str, seq: int, blocks: Sequence[IndexStored],
                          incarnation: int = 0, cap: BlockCap = BlockCap()) -> int | None:
        rec = self._current(worker_id, incarnation)
        if rec is None:
            return None
        resolved = resolve_snapshot(blocks)
        limit = cap.limit(rec.load.total_blocks + rec.load.tier_blocks)
        if limit is not None and len(resolved) > limit:
            raise OverCap(worker_id, limit)
        self._forget_all(worker_id)
        table = self._blocks.setdefault(rec.ns, {})
        held: dict[bytes, bytes] = {}
        for h, (root, mask) in resolved.items():
            held[h] = root
            table.setdefault(h, {})[worker_id] = mask
        self._held[worker_id] = held
        rec.last_seq = seq
        return len(held)

    # --- lookup -------------------------------------------------------------------------

    async def lookup(self, ns: str, hashes: Sequence[bytes], now_ms: int,
                     workers: Collection[str] | None = None) -> dict[str, BlockMatch]:
        blocks = self._blocks.get(ns, {})
        prov = self._prov.get(ns, {})
        allowed = None if workers is None else set(workers)
        active: dict[str, list[int]] = {}
        out: dict[str, BlockMatch] = {}
        for i, h in enumerate(hashes):
            here = dict(blocks.get(h, {}))
            for w, exp in prov.get(h, {}).items():
                if exp > now_ms and w not in here:
                    here[w] = tier_bit(TIER_GPU)
            if i == 0:
                active = {w: [0, 0, 0, 0] for w in here if allowed is None or w in allowed}
            for w in list(active):
                mask = here.get(w, 0)
                if mask:
                    c = active[w]
                    c[0] += 1
                    c[best_tier(mask)] += 1
                else:
                    out[w] = BlockMatch(*active.pop(w))
            if not active:
                break
        for w, c in active.items():
            out[w] = BlockMatch(*c)
        return out

    async def add_provisional(self, ns: str, hashes: Sequence[bytes], worker_id: str,
                              start: int, now_ms: int, ttl_ms: int) -> None:
        prov = self._prov.setdefault(ns, {})
        for h in hashes[start:]:
            holders = {w: exp for w, exp in prov.get(h, {}).items() if exp > now_ms}
            holders[worker_id] = now_ms + ttl_ms
            prov[h] = holders
        # Sweep expired entries when the map has doubled since the last sweep: amortized
        # O(1) per entry, where sweeping at a fixed size would rescan a large live map on
        # every call.
        if len(prov) > self._sweep_at.get(ns, _SWEEP_AT):
            for h in [h for h, hs in prov.items() if max(hs.values()) <= now_ms]:
                del prov[h]
            self._sweep_at[ns] = max(_SWEEP_AT, 2 * len(prov))

    # --- reads --------------------------------------------------------------------------

    async def workers(self, with_blocks: bool = False) -> list[WorkerRecord]:
        return [copy_record(r, indexed_blocks=len(self._held.get(w, {})) if with_blocks else -1)
                for w, r in self._records.items()]

    async def get_worker(self, worker_id: str) -> WorkerRecord | None:
        rec = self._records.get(worker_id)
        return None if rec is None else copy_record(rec)

    # --- tenant quotas ------------------------------------------------------------------

    async def quotas(self) -> Quotas:
        return self._quotas

    async def set_quota(self, tenant: str, quota: Quota | None) -> Quotas:
        self._quotas = self._quotas.with_quota(tenant, quota)
        return self._quotas
