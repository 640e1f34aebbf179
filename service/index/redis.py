"""Redis / Valkey index backend (redis-py asyncio with hiredis), same semantics as memory.

Key layout (``NS`` = ``namespace(model, block_size, algo)``, percent-encoded, so it never
holds ``{``, ``}`` or ``|``; ``ROOT`` and ``HASH`` are lowercase hex block hashes; ``ROOT`` is
the FIRST block hash of the chain a block belongs to)::

    kvm:workers             HASH  worker_id -> NS                              (registry)
    kvm:{NS|w:ID}           HASH  the worker's record: address model bs algo seq rseq hb
                                  reg inc cred running waiting queued free total decode
                                  (inc: incarnation, a decimal string; absent = 0;
                                  cred: credential fingerprint; absent = "")
    kvm:{NS|w:ID}:blocks    HASH  HASH -> ROOT              (reverse index: purge, resync)
    kvm:{NS|ROOT}:b:HASH    STRING ";worker=mask;worker=mask..."  (who holds the block;
                                  mask = one digit of tier bits: 1 GPU, 2 CPU, 4 disk)
    kvm:{NS|ROOT}:p:HASH    STRING ";worker|expiry_ms;..."  (provisional holders; key TTL)
    kvm:{NS|ROOT}:pm        STRING "1"  (set with the TTL whenever the chain gets
                                  provisional entries: lookups skip ':p:' keys without it)

Blocks are STRING keys read with MGET: O(1) per block and one command per chunk of blocks
(a chain in one HASH would be a listpack up to hash-max-listpack-entries fields, where every
field lookup is a linear scan).

Redis Cluster: everything between ``{`` and ``}`` is the hash tag, so every key of one chain
(its holders and its provisional entries) lives in ONE slot: a lookup is one script on one
node, while different prefixes, and different tenants (a salt changes block 0, hence ROOT),
spread over the cluster. A worker's record and reverse index share the worker's own slot.
New blocks find their ROOT through the worker's reverse index (the parent's root), which is
why it stores HASH -> ROOT rather than a plain set.

Round trips: Route = 1 (``LOOKUP``) + 1 only when it records provisional entries; events,
snapshots, heartbeats, registration and purge = 1 script each. Scripts are loaded once
(``SCRIPT LOAD``) and called by SHA; after a ``NOSCRIPT`` (a restarted or flushed server)
they are loaded again and the call is retried once.

Limits: the lookup and provisional scripts are single-slot and fit Redis Cluster. The
event, snapshot, register and purge scripts touch the worker's keys AND chain keys of
several slots, which a standalone server (or Valkey/Redis with one shard, or Sentinel)
executes atomically; on a multi-shard cluster they would have to be split per slot.
Heartbeat timestamps come from the service replicas' clocks: keep them NTP-synced.
"""
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Collection, Sequence
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions as rexc
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.retry import Retry

from service.index import scripts
from service.index.base import (
    ApplyResult,
    ApplyStatus,
    BlockCap,
    BlockMatch,
    Cleared,
    HeartbeatResult,
    IndexBackend,
    IndexUnavailable,
    KvEvent,
    OverCap,
    Removed,
    StaleIncarnation,
    Stored,
    WorkerIdInUse,
    WorkerLoad,
    WorkerRecord,
    resolve_snapshot,
    tier_bit,
)
from service.index.connect import redis_client

REGISTRY = "kvm:workers"
# (WorkerLoad field, record field, type): counts are ints, measured costs floats (stored
# as repr(), which round-trips exactly).
_LOAD_FIELDS = (("running", "running", int), ("waiting", "waiting", int),
                ("queued_prefill_tokens", "queued", int), ("free_blocks", "free", int),
                ("total_blocks", "total", int), ("decode_tokens", "decode", int),
                ("prefill_us_per_token", "prefill_us", float),
                ("onboard_us_per_block_cpu", "onboard_cpu_us", float),
                ("onboard_us_per_block_disk", "onboard_disk_us", float),
                ("tier_blocks", "tiers", int))
# Anything the server or the socket answers instead of a result (refused, timeout, LOADING,
# READONLY after a failover, OOM under maxmemory...) means "the index is unavailable".
_DOWN = (rexc.RedisError, OSError)


def worker_key(ns: str, worker_id: str) -> str:
    return f"kvm:{{{ns}|w:{worker_id}}}"


def chain_prefix(ns: str) -> str:
    """Prefix of every chain key of ``ns``: ``chain_prefix(ns) + ROOT + '}:b:' + HASH``."""
    return f"kvm:{{{ns}|"


def chain_keys(ns: str, root: bytes) -> str:
    """Prefix of every key of one chain: ``+ 'b:' + HASH`` or ``+ 'p:' + HASH``."""
    return f"kvm:{{{ns}|{root.hex()}}}:"


def _hexes(hashes: Sequence[bytes]) -> str:
    return b"".join(hashes).hex()


def _width(events: Sequence[KvEvent]) -> int:
    """Digest size of a batch (the service validated that all its hashes share it)."""
    for ev in events:
        if isinstance(ev.op, (Stored, Removed)) and ev.op.hashes:
            return len(ev.op.hashes[0])
    return 32


def _record(wid: str, ns: str, f: dict[str, str]) -> WorkerRecord:
    load = WorkerLoad(**{name: kind(f.get(short, 0)) for name, short, kind in _LOAD_FIELDS})
    return WorkerRecord(worker_id=wid, ns=ns, address=f.get("address", ""),
                        model=f.get("model", ""), block_size=int(f.get("bs", 0)),
                        algo=f.get("algo", ""), load=load, last_seq=int(f.get("seq", 0)),
                        reported_seq=int(f.get("rseq", 0)), heartbeat_ms=int(f.get("hb", 0)),
                        registered_ms=int(f.get("reg", 0)), incarnation=int(f.get("inc", 0)),
                        credential=f.get("cred", ""))


def _load_args(load: WorkerLoad) -> list[Any]:
    out: list[Any] = []
    for name, short, kind in _LOAD_FIELDS:
        out += [short, repr(float(getattr(load, name))) if kind is float else getattr(load, name)]
    return out


class RedisBackend(IndexBackend):
    """The production backend; see the module docstring for the layout."""

    name = "redis"

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self._ns_of: dict[str, str] = {}  # worker id -> ns (cache of the registry)
        # redis-py's scripts are called by SHA and loaded again (once) on NOSCRIPT
        script = client.register_script
        self._register = script(scripts.REGISTER)
        self._heartbeat = script(scripts.HEARTBEAT)
        self._apply = script(scripts.APPLY)
        self._sync = script(scripts.SYNC)
        self._purge = script(scripts.PURGE)
        self._lookup = script(scripts.LOOKUP)
        self._provisional = script(scripts.PROVISIONAL)

    @classmethod
    def from_url(cls, url: str, timeout_s: float = 0.5) -> RedisBackend:
        """A backend on ``url`` (password and ``rediss://`` TLS options as redis-py takes
        them); connects lazily (the server may be down at start)."""
        client = redis_client(  # a cluster for redis+cluster:// (service.index.connect)
            url, decode_responses=True, socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 1),
            health_check_interval=0)
        return cls(client)

    @contextlib.asynccontextmanager
    async def _guard(self) -> AsyncIterator[None]:
        try:
            yield
        except _DOWN as e:
            raise IndexUnavailable(f"redis unreachable: {e}") from e

    async def load_scripts(self) -> None:
        """SCRIPT LOAD every script (optional: calls load them on NOSCRIPT anyway)."""
        async with self._guard():
            for s in (self._register, self._heartbeat, self._apply, self._sync, self._purge,
                      self._lookup, self._provisional):
                await self.client.script_load(s.script)

    async def ping(self) -> None:
        async with self._guard():
            await self.client.ping()

    async def close(self) -> None:
        await self.client.aclose()

    async def _ns(self, worker_id: str, fresh: bool = False) -> str | None:
        if fresh or worker_id not in self._ns_of:
            async with self._guard():
                ns = await self.client.hget(REGISTRY, worker_id)
            if ns is None:
                self._ns_of.pop(worker_id, None)
                return None
            self._ns_of[worker_id] = ns
        return self._ns_of[worker_id]

    async def _worker_call(self, worker_id: str, script: AsyncScript, args: Sequence[Any],
                           unknown: Any, extra_first: bool = False) -> Any:
        """Run a per-worker script with KEYS = [record, reverse index] (``extra_first``: the
        registry first), resolving the worker's ns through the cached registry; callables in
        ``args`` are called with that ns. When the script answers ``unknown``, retry once
        with the registry re-read (another replica may have re-registered the worker)."""
        for fresh in (False, True):
            ns = await self._ns(worker_id, fresh)
            if ns is None:
                return unknown
            wk = worker_key(ns, worker_id)
            keys = [REGISTRY, wk, wk + ":blocks"] if extra_first else [wk, wk + ":blocks"]
            argv = [a(ns) if callable(a) else a for a in args]
            async with self._guard():
                res = await script(keys, argv)
            if res != unknown:
                return res
        return unknown

    # --- writes -------------------------------------------------------------------------

    async def register(self, record: WorkerRecord, live_after_ms: int | None = None) -> bool:
        wk = worker_key(record.ns, record.worker_id)
        fields: list[Any] = ["address", record.address, "model", record.model,
                             "bs", record.block_size, "algo", record.algo, "seq", 0, "rseq", 0,
                             "hb", record.heartbeat_ms, "reg", record.registered_ms,
                             "inc", str(record.incarnation), "cred", record.credential,
                             *_load_args(record.load)]
        guard = [("" if live_after_ms is None else live_after_ms), record.address,
                 record.credential]
        async with self._guard():
            had = await self._register([REGISTRY, wk, wk + ":blocks"],
                                       [record.worker_id, record.ns, *guard, *fields])
        if had == -1:
            raise WorkerIdInUse(record.worker_id)
        self._ns_of[record.worker_id] = record.ns
        return bool(had)

    async def heartbeat(self, worker_id: str, load: WorkerLoad, reported_seq: int,
                        now_ms: int, incarnation: int = 0) -> HeartbeatResult:
        args = [now_ms, reported_seq, str(incarnation), *_load_args(load)]
        known, seq, prev = await self._worker_call(worker_id, self._heartbeat, args, [0, 0, 0])
        if known == -1:
            raise StaleIncarnation(worker_id, incarnation)
        if not known:
            return HeartbeatResult(known=False)
        return HeartbeatResult(True, int(seq), int(prev))

    async def apply_events(self, worker_id: str, events: Sequence[KvEvent],
                           incarnation: int = 0, cap: BlockCap = BlockCap()) -> ApplyResult:
        if not events:  # a read: nothing to apply, so nothing to race with
            rec = await self.get_worker(worker_id)
            if rec is None:
                return ApplyResult(ApplyStatus.UNKNOWN_WORKER, 0, 0)
            if rec.incarnation != incarnation:
                raise StaleIncarnation(worker_id, incarnation)
            return ApplyResult(ApplyStatus.OK, 0, rec.last_seq)
        flat: list[Any] = []
        for ev in events:
            op = ev.op
            if isinstance(op, Stored):
                flat += ["S", tier_bit(op.tier), op.parent.hex(), _hexes(op.hashes)]
            elif isinstance(op, Removed):
                flat += ["R", tier_bit(op.tier), _hexes(op.hashes)]
            elif isinstance(op, Cleared):
                flat.append("C")
        width = 2 * _width(events)
        args = [chain_prefix, worker_id, events[0].seq, events[-1].seq, width,
                str(incarnation), cap.per_pool, cap.floor, *flat]
        status, applied, last = await self._worker_call(worker_id, self._apply, args,
                                                        [-2, 0, 0])
        if status == -3:
            raise StaleIncarnation(worker_id, incarnation)
        if status == -4:
            raise OverCap(worker_id, int(applied), dropped=bool(int(last)))
        kind = {1: ApplyStatus.OK, 0: ApplyStatus.DUPLICATE, -1: ApplyStatus.GAP}.get(
            int(status), ApplyStatus.UNKNOWN_WORKER)
        return ApplyResult(kind, int(applied), int(last))

    async def sync_worker(self, worker_id: str, seq: int, blocks: Sequence[Stored],
                          incarnation: int = 0, cap: BlockCap = BlockCap()) -> int | None:
        resolved = resolve_snapshot(blocks)
        width = 2 * len(next(iter(resolved))) if resolved else 64
        args = [chain_prefix, worker_id, seq, width, _hexes(list(resolved)),
                _hexes([r for r, _ in resolved.values()]),
                "".join(str(m) for _, m in resolved.values()), str(incarnation),
                cap.per_pool, cap.floor]
        n = int(await self._worker_call(worker_id, self._sync, args, -1))
        if n == -2:
            raise StaleIncarnation(worker_id, incarnation)
        if n <= -3:
            raise OverCap(worker_id, -3 - n)
        return None if n < 0 else n

    async def purge_worker(self, worker_id: str, heartbeat_before_ms: int | None = None) -> bool:
        deadline = "" if heartbeat_before_ms is None else heartbeat_before_ms
        done = await self._worker_call(
            worker_id, self._purge, [worker_id, chain_prefix, lambda ns: ns, deadline], 0,
            extra_first=True)
        if done:
            self._ns_of.pop(worker_id, None)
        return bool(done)

    # --- lookup -------------------------------------------------------------------------

    async def lookup(self, ns: str, hashes: Sequence[bytes], now_ms: int,
                     workers: Collection[str] | None = None) -> dict[str, BlockMatch]:
        if not hashes:
            return {}
        root = hashes[0]
        allow: list[Any] = [-1] if workers is None else [len(workers), *workers]
        async with self._guard():
            kp = chain_keys(ns, root)
            flat = await self._lookup([f"{kp}b:{root.hex()}"],
                                      [kp, now_ms, 2 * len(root), _hexes(hashes), *allow])
        return {flat[i]: BlockMatch(int(flat[i + 1]), int(flat[i + 2]), int(flat[i + 3]),
                                    int(flat[i + 4])) for i in range(0, len(flat), 5)}

    async def add_provisional(self, ns: str, hashes: Sequence[bytes], worker_id: str,
                              start: int, now_ms: int, ttl_ms: int) -> None:
        if start >= len(hashes):
            return
        kp = chain_keys(ns, hashes[0])
        args = [kp, worker_id, now_ms + ttl_ms, now_ms, ttl_ms, 2 * len(hashes[0]),
                _hexes(hashes[start:])]
        async with self._guard():
            await self._provisional([f"{kp}b:{hashes[0].hex()}"], args)

    # --- reads --------------------------------------------------------------------------

    async def workers(self, with_blocks: bool = False) -> list[WorkerRecord]:
        async with self._guard():
            reg: dict[str, str] = await self.client.hgetall(REGISTRY)
            if not reg:
                return []
            pipe = self.client.pipeline(transaction=False)
            for wid, ns in reg.items():
                pipe.hgetall(worker_key(ns, wid))
                if with_blocks:
                    pipe.hlen(worker_key(ns, wid) + ":blocks")
            res = await pipe.execute()
        self._ns_of.update(reg)
        out: list[WorkerRecord] = []
        step = 2 if with_blocks else 1
        for i, (wid, ns) in enumerate(reg.items()):
            fields = res[i * step]
            if not fields:
                continue  # purged between the two reads
            rec = _record(wid, ns, fields)
            if with_blocks:
                rec.indexed_blocks = int(res[i * step + 1])
            out.append(rec)
        return out

    async def get_worker(self, worker_id: str) -> WorkerRecord | None:
        ns = await self._ns(worker_id, fresh=True)
        if ns is None:
            return None
        async with self._guard():
            fields = await self.client.hgetall(worker_key(ns, worker_id))
        return _record(worker_id, ns, fields) if fields else None
