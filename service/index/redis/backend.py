"""Redis / Valkey index backend (redis-py asyncio with hiredis), same semantics as memory.

Lookups run no script (one MULTI/EXEC snapshot of hand-packed reads, the walk in the
service); every write is one Lua script, loaded once and called by SHA (reloaded after
``NOSCRIPT``). A worker's entries are all dropped at once by retiring its handle; the sweep
reclaims them later. A ``redis+cluster://`` URL gets ``ClusterBackend``. Heartbeat times
come from the replicas' clocks: keep them NTP-synced.

See docs/architecture.md#the-redis-layout-serviceindexredis.
"""
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Collection, Sequence
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions as rexc
from redis.asyncio.cluster import RedisCluster
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.retry import Retry

from kvmesh.quota import ALL_TENANTS, Quota, Quotas, check_tenant
from service.index.base import (
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
    IndexUnavailable,
    OverCap,
    StaleIncarnation,
    WorkerIdInUse,
    WorkerLoad,
    WorkerRecord,
    resolve_snapshot,
    tier_bit,
)
from service.index.connect import redis_client
from service.index.redis import keys, lua, resp
from service.index.redis.keys import (
    REGISTRY,
    block_key,
    block_keys,
    live_key,
    prov_marker,
    worker_key,
)
from service.index.redis.walk import walk

__all__ = ["REGISTRY", "RedisBackend", "worker_key"]
# (WorkerLoad field, record field, type): counts are ints, measured costs floats (stored
# as repr(), which round-trips exactly), switches 0/1.
_LOAD_FIELDS = (("running", "running", int), ("waiting", "waiting", int),
                ("queued_prefill_tokens", "queued", int), ("free_blocks", "free", int),
                ("total_blocks", "total", int), ("decode_tokens", "decode", int),
                ("prefill_us_per_token", "prefill_us", float),
                ("onboard_us_per_block_cpu", "onboard_cpu_us", float),
                ("onboard_us_per_block_disk", "onboard_disk_us", float),
                ("tier_blocks", "tiers", int), ("free_empty_blocks", "empty", int),
                ("fetch_us_per_block", "fetch_us", float),
                ("fetch_us_per_call", "fetch_call_us", float),
                ("peer_fetch", "peer", bool))
# Anything the server or the socket answers instead of a result (refused, timeout, LOADING,
# READONLY after a failover, OOM under maxmemory...) means "the index is unavailable".
_DOWN = (rexc.RedisError, rexc.RedisClusterException, OSError)  # the last: a slot no node serves
SWEEP_COUNT = 1000  # block keys per sweep step (about a millisecond of Redis time)


def _record(wid: str, ns: str, f: dict[str, str]) -> WorkerRecord:
    load = WorkerLoad(**{name: bool(int(f.get(short, 0))) if kind is bool
                         else kind(f.get(short, 0)) for name, short, kind in _LOAD_FIELDS})
    return WorkerRecord(worker_id=wid, ns=ns, address=f.get("address", ""),
                        model=f.get("model", ""), block_size=int(f.get("bs", 0)),
                        algo=f.get("algo", ""), load=load, last_seq=int(f.get("seq", 0)),
                        reported_seq=int(f.get("rseq", 0)), heartbeat_ms=int(f.get("hb", 0)),
                        registered_ms=int(f.get("reg", 0)), incarnation=int(f.get("inc", 0)),
                        credential=f.get("cred", ""))


def _load_args(load: WorkerLoad) -> list[Any]:
    out: list[Any] = []
    for name, short, kind in _LOAD_FIELDS:
        value = getattr(load, name)
        out += [short, repr(float(value)) if kind is float else int(value)]
    return out


class RedisBackend(IndexBackend):
    """The production backend; see ``keys.py`` for the layout."""

    name = "redis"

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self._ns_of: dict[str, str] = {}  # worker id -> ns (cache of the registry)
        # redis-py's scripts are called by SHA and loaded again (once) on NOSCRIPT
        script = client.register_script
        self._register = script(lua.text("register"))
        self._heartbeat = script(lua.text("heartbeat"))
        self._apply = script(lua.text("apply"))
        self._sync = script(lua.text("sync"))
        self._purge = script(lua.text("purge"))
        self._sweep = script(lua.text("sweep"))
        self._provisional = script(lua.text("provisional"))
        # ns -> (version, handle -> worker id): the live map as of its version 'v'
        self._live: dict[str, tuple[bytes | None, dict[int, str]]] = {}
        self._prov_seen: dict[str, bool] = {}  # ns -> its marker existed at the last lookup

    @classmethod
    def from_url(cls, url: str, timeout_s: float = 0.5) -> RedisBackend:
        """A backend on ``url`` (password and ``rediss://`` TLS options as redis-py takes
        them); connects lazily (the server may be down at start)."""
        client = redis_client(  # a cluster for redis+cluster:// (service.index.connect)
            url, decode_responses=True, socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 1),
            health_check_interval=0)
        if isinstance(client, RedisCluster):  # the per-slot split (service/index/cluster.py)
            from service.index.cluster import ClusterBackend

            return ClusterBackend(client)
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
                      self._sweep, self._provisional):
                await self.client.script_load(s.script)

    async def ping(self) -> None:
        async with self._guard():
            await self.client.ping()

    async def close(self) -> None:
        await self.client.aclose()

    # --- tenant quotas (one hash on the control slot; a field per tenant) -----------------

    async def quotas(self) -> Quotas:
        async with self._guard():
            return keys.quotas_of(await self.client.hgetall(keys.QUOTAS))

    async def set_quota(self, tenant: str, quota: Quota | None) -> Quotas:
        name = tenant if tenant == ALL_TENANTS else check_tenant(tenant)
        async with self._guard():
            if quota is None or quota.empty:
                await self.client.hdel(keys.QUOTAS, name)
            else:
                await self.client.hset(keys.QUOTAS, name, keys.quota_value(quota))
        return await self.quotas()

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
                           unknown: Any, registry_first: bool = False) -> Any:
        """Run a per-worker script with KEYS = [record] ([registry, record] with
        ``registry_first``) and ARGV = [ns, worker id, *args], resolving the worker's ns
        through the cached registry. When the script answers ``unknown``, retry once with
        the registry re-read (another replica may have re-registered the worker)."""
        for fresh in (False, True):
            ns = await self._ns(worker_id, fresh)
            if ns is None:
                return unknown
            wk = worker_key(ns, worker_id)
            keys = [REGISTRY, wk] if registry_first else [wk]
            async with self._guard():
                res = await script(keys, [ns, worker_id, *args])
            if res != unknown:
                return res
        return unknown

    # --- writes -------------------------------------------------------------------------

    async def register(self, record: WorkerRecord, live_after_ms: int | None = None) -> bool:
        had = int(await self._register_call(record, live_after_ms))
        if had == -1:
            raise WorkerIdInUse(record.worker_id)
        self._ns_of[record.worker_id] = record.ns
        return bool(had)

    async def _register_call(self, record: WorkerRecord, live_after_ms: int | None) -> Any:
        """The registration script's answer (REGISTER's contract; the cluster's: a list)."""
        wk = worker_key(record.ns, record.worker_id)
        fields: list[Any] = ["address", record.address, "model", record.model,
                             "bs", record.block_size, "algo", record.algo, "seq", 0, "rseq", 0,
                             "hb", record.heartbeat_ms, "reg", record.registered_ms,
                             "inc", str(record.incarnation), "cred", record.credential,
                             *_load_args(record.load)]
        guard = [("" if live_after_ms is None else live_after_ms), record.address,
                 record.credential]
        async with self._guard():
            return await self._register([REGISTRY, wk],
                                        [record.worker_id, record.ns, *guard, *fields])

    async def heartbeat(self, worker_id: str, load: WorkerLoad, reported_seq: int,
                        now_ms: int, incarnation: int = 0) -> HeartbeatResult:
        args = [now_ms, reported_seq, str(incarnation), *_load_args(load)]
        for fresh in (False, True):
            ns = await self._ns(worker_id, fresh)
            if ns is None:
                return HeartbeatResult(known=False)
            async with self._guard():
                known, seq, prev = await self._beat(ns, worker_id, args, load)
            if known:
                break
        if known == -1:
            raise StaleIncarnation(worker_id, incarnation)
        if not known:
            return HeartbeatResult(known=False)
        return HeartbeatResult(True, seq, prev)

    async def _beat(self, ns: str, worker_id: str, args: list[Any], load: WorkerLoad
                    ) -> tuple[int, int, int]:
        """One heartbeat's write: (1 known, 0 unknown, -1 stale incarnation; the index's
        last seq; the previous heartbeat's reported seq)."""
        known, seq, prev = await self._heartbeat([worker_key(ns, worker_id)], args)
        return int(known), int(seq), int(prev)

    async def apply_events(self, worker_id: str, events: Sequence[IndexEvent],
                           incarnation: int = 0, cap: BlockCap = BlockCap()) -> ApplyResult:
        if not events:  # a read: nothing to apply, so nothing to race with
            rec = await self.get_worker(worker_id)
            if rec is None:
                return ApplyResult(ApplyStatus.UNKNOWN_WORKER, 0, 0)
            if rec.incarnation != incarnation:
                raise StaleIncarnation(worker_id, incarnation)
            return ApplyResult(ApplyStatus.OK, 0, rec.last_seq)
        flat: list[Any] = []
        width = 32
        for ev in events:
            op = ev.op
            if isinstance(op, IndexStored):
                flat += ["S", tier_bit(op.tier), block_key(op.parent) if op.parent else b"",
                         block_keys(op.hashes)]
            elif isinstance(op, IndexRemoved):
                flat += ["R", tier_bit(op.tier), block_keys(op.hashes)]
            elif isinstance(op, IndexCleared):
                flat.append("C")
                continue
            if op.hashes:  # the service validated that every hash of a batch has one size
                width = len(op.hashes[0])
        args = [events[0].seq, events[-1].seq, len(block_key(bytes(width))), str(incarnation),
                cap.per_pool, cap.floor, *flat]
        status, applied, last = await self._worker_call(worker_id, self._apply, args,
                                                        [-2, 0, 0])
        if status == -3:
            raise StaleIncarnation(worker_id, incarnation)
        if status == -4:
            raise OverCap(worker_id, int(applied), dropped=bool(int(last)))
        kind = {1: ApplyStatus.OK, 0: ApplyStatus.DUPLICATE, -1: ApplyStatus.GAP}.get(
            int(status), ApplyStatus.UNKNOWN_WORKER)
        return ApplyResult(kind, int(applied), int(last))

    async def sync_worker(self, worker_id: str, seq: int, blocks: Sequence[IndexStored],
                          incarnation: int = 0, cap: BlockCap = BlockCap()) -> int | None:
        resolved = resolve_snapshot(blocks)
        width = len(next(iter(resolved))) if resolved else 32
        args = [seq, len(block_key(bytes(width))), block_keys(list(resolved)),
                "".join(str(m) for _, m in resolved.values()), str(incarnation), cap.per_pool,
                cap.floor]
        n = int(await self._worker_call(worker_id, self._sync, args, -1))
        if n == -2:
            raise StaleIncarnation(worker_id, incarnation)
        if n <= -3:
            raise OverCap(worker_id, -3 - n)
        return None if n < 0 else n

    async def purge_worker(self, worker_id: str, heartbeat_before_ms: int | None = None) -> bool:
        deadline = "" if heartbeat_before_ms is None else heartbeat_before_ms
        done = await self._worker_call(worker_id, self._purge, [deadline], 0,
                                       registry_first=True)
        if done:
            self._ns_of.pop(worker_id, None)
        return bool(done)

    async def sweep(self, max_steps: int = 64) -> int:
        """Drop retired handles' entries, at most ``max_steps`` SCAN steps of
        ``SWEEP_COUNT`` block keys (one script each); returns the entries dropped. Costs one
        command when nothing was retired."""
        dropped = 0
        for _ in range(max_steps):
            async with self._guard():
                state, _, n = await self._sweep(
                    [keys.SWEEP, keys.DEAD, keys.CYCLE, keys.FREE], [SWEEP_COUNT])
            dropped += int(n)
            if state != 1:
                break
        return dropped

    # --- lookup -------------------------------------------------------------------------

    async def lookup(self, ns: str, hashes: Sequence[bytes], now_ms: int,
                     workers: Collection[str] | None = None) -> dict[str, BlockMatch]:
        """One round trip: a MULTI/EXEC snapshot of the live map's version, the provisional
        marker and every block key (``MGET``), plus the provisional keys when the marker
        existed at the last lookup; the walk runs here (``walk.py``). A live map whose
        version moved since it was cached, or a marker that appeared, costs one more."""
        if not hashes:
            return {}
        lk, marker = live_key(ns).encode(), prov_marker(ns).encode()
        cached = self._live.get(ns)
        with_prov = self._prov_seen.get(ns, False)
        for attempt in range(3):
            full = cached is None or attempt > 0
            cmds = [resp.command(b"HGETALL", lk) if full else resp.command(b"HGET", lk, b"v"),
                    resp.command(b"EXISTS", marker), resp.mget(hashes)]
            if with_prov:
                cmds.append(resp.mget(hashes, b"p", ns.encode()))
            async with self._guard():
                res = await resp.transact(self.client, cmds)
            stale = not full and res[0] != cached[0]  # type: ignore[index]
            if full:
                cached = self._live[ns] = keys.live_map(res[0])
            if not stale and (with_prov or not res[1]):
                break
            with_prov = with_prov or bool(res[1])  # provisional entries appeared: read them
        self._prov_seen[ns] = bool(res[1])
        pvalues = res[3] if res[1] and with_prov else None
        assert cached is not None
        return walk(res[2], pvalues, cached[1], now_ms, workers)

    async def add_provisional(self, ns: str, hashes: Sequence[bytes], worker_id: str,
                              start: int, now_ms: int, ttl_ms: int) -> None:
        if start >= len(hashes):
            return
        pks = keys.prov_keys(ns, hashes[start:])
        args = [worker_id, now_ms + ttl_ms, now_ms, ttl_ms, len(pks) // (len(hashes) - start),
                pks]
        async with self._guard():
            await self._provisional([prov_marker(ns)], args)

    # --- reads --------------------------------------------------------------------------

    async def workers(self, with_blocks: bool = False) -> list[WorkerRecord]:
        async with self._guard():
            reg: dict[str, str] = await self.client.hgetall(REGISTRY)
            if not reg:
                return []
            pipe = self.client.pipeline(transaction=False)
            for wid, ns in reg.items():
                pipe.hgetall(worker_key(ns, wid))
            res = await pipe.execute()
        self._ns_of.update(reg)
        out: list[WorkerRecord] = []
        for (wid, ns), fields in zip(reg.items(), res, strict=True):
            if not fields:
                continue  # purged between the two reads
            rec = _record(wid, ns, fields)
            if with_blocks:
                rec.indexed_blocks = int(fields.get("n", 0))
            out.append(rec)
        return out

    async def get_worker(self, worker_id: str) -> WorkerRecord | None:
        ns = await self._ns(worker_id, fresh=True)
        if ns is None:
            return None
        async with self._guard():
            fields = await self.client.hgetall(worker_key(ns, worker_id))
        return _record(worker_id, ns, fields) if fields else None
