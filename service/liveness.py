"""A replica's view of the registered workers, and who is alive.

Each replica re-reads the records every ``refresh_interval_s``; alive iff
``now - heartbeat < liveness_timeout``, computed at read time (no janitor involved). When
the index is unreachable the last records stand. Between heartbeats Route adds the work it
sent to a worker's load, so a burst does not pile onto one worker.

See docs/architecture.md#routing-in-the-service.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from service.index.base import WorkerLoad, WorkerRecord


@dataclass(slots=True)
class _Pending:
    heartbeat_ms: int
    tokens: int = 0
    requests: int = 0


class WorkerTable:
    """Cached worker records with liveness; single event loop, no locking needed."""

    def __init__(self, liveness_timeout_ms: int) -> None:
        self.timeout_ms = liveness_timeout_ms
        self._records: dict[str, WorkerRecord] = {}
        self._pending: dict[str, _Pending] = {}
        # Records that vanished from the backend while their worker was alive (Redis emptied
        # or restarted): worker id -> (record, when it vanished). Kept for degraded routing
        # for two liveness timeouts, time enough for the worker to register again.
        self._lost: dict[str, tuple[WorkerRecord, int]] = {}
        self.last_refresh_ms = 0

    def replace_all(self, records: list[WorkerRecord], now_ms: int) -> None:
        """Adopt a fresh read of the backend (keeping newer local heartbeats)."""
        fresh: dict[str, WorkerRecord] = {}
        for rec in records:
            old = self._records.get(rec.worker_id)
            if old is not None and old.ns == rec.ns and old.heartbeat_ms > rec.heartbeat_ms:
                rec.heartbeat_ms, rec.load = old.heartbeat_ms, old.load
            fresh[rec.worker_id] = rec
        for wid, old in self._records.items():
            # degraded_alive: this replica may have missed the worker's recent heartbeats
            # (they went to another replica) while the backend was down.
            if wid not in fresh and wid not in self._lost and self.degraded_alive(old, now_ms):
                self._lost[wid] = (old, now_ms)
        self._lost = {w: (r, t) for w, (r, t) in self._lost.items()
                      if w not in fresh and now_ms - t < 2 * self.timeout_ms}
        self._records = fresh
        self._pending = {w: p for w, p in self._pending.items()
                         if w in fresh and fresh[w].heartbeat_ms <= p.heartbeat_ms}
        self.last_refresh_ms = now_ms

    def upsert(self, record: WorkerRecord) -> None:
        self._records[record.worker_id] = record
        self._pending.pop(record.worker_id, None)

    def heartbeat(self, worker_id: str, load: WorkerLoad, now_ms: int) -> None:
        rec = self._records.get(worker_id)
        if rec is not None:
            rec.load, rec.heartbeat_ms = load, now_ms
            self._pending.pop(worker_id, None)

    def remove(self, worker_id: str) -> None:
        self._records.pop(worker_id, None)
        self._lost.pop(worker_id, None)
        self._pending.pop(worker_id, None)

    def get(self, worker_id: str) -> WorkerRecord | None:
        return self._records.get(worker_id)

    def all(self) -> list[WorkerRecord]:
        return list(self._records.values())

    def alive(self, rec: WorkerRecord, now_ms: int) -> bool:
        return now_ms - rec.heartbeat_ms < self.timeout_ms

    def degraded_alive(self, rec: WorkerRecord, now_ms: int) -> bool:
        return (self.alive(rec, now_ms)
                or rec.heartbeat_ms > self.last_refresh_ms - self.timeout_ms)

    def live(self, now_ms: int, degraded: bool = False) -> list[WorkerRecord]:
        check = self.degraded_alive if degraded else self.alive
        live = [r for r in self._records.values() if check(r, now_ms)]
        if degraded:
            live += [r for r, t in self._lost.values() if now_ms - t < 2 * self.timeout_ms]
        return live

    def lost(self, now_ms: int) -> bool:
        """Whether workers alive a moment ago vanished from the backend (it was emptied)."""
        return any(now_ms - t < 2 * self.timeout_ms for _, t in self._lost.values())

    def load(self, rec: WorkerRecord) -> WorkerLoad:
        """The reported load plus what this replica routed there since that report."""
        p = self._pending.get(rec.worker_id)
        if p is None or p.heartbeat_ms != rec.heartbeat_ms:
            return rec.load
        return replace(rec.load, waiting=rec.load.waiting + p.requests,
                       queued_prefill_tokens=rec.load.queued_prefill_tokens + p.tokens)

    def routed_since_heartbeat(self, rec: WorkerRecord) -> tuple[int, int]:
        """``(requests, prefill tokens)`` this replica routed to ``rec``'s worker since its
        last heartbeat: what :meth:`load` adds to the reported load."""
        p = self._pending.get(rec.worker_id)
        if p is None or p.heartbeat_ms != rec.heartbeat_ms:
            return 0, 0
        return p.requests, p.tokens

    def add_work(self, worker_id: str, prefill_tokens: int) -> None:
        """Count a request just routed to ``worker_id`` until its next heartbeat."""
        rec = self._records.get(worker_id)
        if rec is None:
            return
        p = self._pending.get(worker_id)
        if p is None or p.heartbeat_ms != rec.heartbeat_ms:
            p = self._pending[worker_id] = _Pending(rec.heartbeat_ms)
        p.tokens += prefill_tokens
        p.requests += 1
