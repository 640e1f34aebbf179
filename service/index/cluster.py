"""The redis backend on a multi-shard Redis Cluster: every command touches one slot, and
what touches many is split per node (``RedisBackend.from_url`` picks this class for a
``redis+cluster://`` URL).

Same keys and answers as the single-server and memory backends. A lookup is one parallel
round trip; a batch or snapshot three (begin on the control slot, a wave of per-node
writes, end: ``node_waves.py``). A lookup racing a batch can only see a match cut short,
never a block the worker did not hold. A step that fails midway leaves ``pend`` set, so
the worker resyncs.

See docs/architecture.md#redis-cluster-details.
"""
from __future__ import annotations

import secrets
from collections.abc import Collection, Sequence
from typing import Any

import redis.exceptions as rexc
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from service.index import cluster_upkeep, node_waves, nodes
from service.index.base import (
    ApplyResult,
    ApplyStatus,
    BlockCap,
    BlockMatch,
    IndexCleared,
    IndexEvent,
    IndexRemoved,
    IndexStored,
    IndexUnavailable,
    OverCap,
    StaleIncarnation,
    WorkerIdInUse,
    WorkerRecord,
    resolve_snapshot,
    tier_bit,
)
from service.index.redis import RedisBackend, keys, lua, resp
from service.index.redis.keys import block_key, live_key, prov_marker, worker_key
from service.index.redis.lua import RawScript
from service.index.redis.walk import walk

__all__ = ["CTL_SLOT", "SLOT_OF_BYTE", "TAG_SLOTS", "ClusterBackend"]

CTL_SLOT = key_slot(keys.REGISTRY.encode())
TAG_SLOTS = [key_slot(bytes([t])) for t in keys.TAGS]  # by tag index
SLOT_OF_BYTE = node_waves.SLOT_OF_BYTE
# The scripts called by SHA inside hand-packed batches (``nodes.py``): the per-node and
# per-tag steps (``node_waves.py``), and the control slot's begin and end steps of a batch
# or snapshot (sent beside the batch's reads, and without redis-py's cluster command path,
# which cost more than the step itself). A node that answers ``NOSCRIPT`` gets every one of
# them loaded and the calls sent again (:meth:`ClusterBackend.wave_replies`).
RAW_SCRIPTS = tuple(lua.raw(f"cluster_{n}") for n in (
    "node_write", "tag_clean", "prov_keys", "apply_begin",
    "apply_end", "sync_begin", "sync_end", "tag_fence", "tag_identity"))
NODE_WRITE = TAG_WRITE = node_waves.NODE_WRITE  # one tag's write: a node's, of one tag
APPLY_BEGIN, APPLY_END, SYNC_BEGIN, SYNC_END = (lua.raw(f"cluster_{n}") for n in (
    "apply_begin", "apply_end", "sync_begin", "sync_end"))


def _b(x: Any) -> bytes:
    return x if isinstance(x, bytes) else str(x).encode()


def _bits(value: bytes | None, hb: bytes) -> int:
    """The tier bits of handle ``hb``'s entry in a block value (0: none)."""
    if value:
        for i in range(0, len(value), keys.ENTRY_BYTES):
            if value[i:i + 3] == hb:
                return value[i + 3]
    return 0


def _check(replies: list[Any]) -> list[Any]:
    for r in replies:
        if isinstance(r, Exception):
            raise r
    return replies


class ClusterBackend(RedisBackend):
    """``RedisBackend`` with every command single-slot (see the module contract)."""

    def __init__(self, client: RedisCluster) -> None:
        super().__init__(client)  # type: ignore[arg-type]
        script = client.register_script
        self._register = script(lua.text("cluster_register"))
        self._heartbeat = script(lua.text("cluster_heartbeat"))
        self._lost = script(lua.text("cluster_lost"))
        self._sweep_begin = script(lua.text("cluster_sweep_begin"))
        self._sweep_step = script(lua.text("cluster_sweep_step"))
        self.upkeep = cluster_upkeep.Upkeep(self)

    async def load_scripts(self) -> None:
        await super().load_scripts()
        async with self._guard():
            for s in (self._lost, self._sweep_begin, self._sweep_step):
                await self.client.script_load(s.script)
            for r in RAW_SCRIPTS:
                await self.client.script_load(r.script)

    async def wave_replies(self, batch: list[tuple[int, bytes]],
                           retry: bool = False) -> list[Any]:
        """Replies of ``batch`` (``(slot, command)``, in parallel over the shards), error
        replies in place; a raw script missing on a node loaded there and its calls sent
        again (they did not run)."""
        if not batch:
            return []
        res = await nodes.on_slots(self.client, batch, retry)
        missing = [i for i, r in enumerate(res) if isinstance(r, rexc.NoScriptError)]
        if missing:
            where = {await nodes.primary(self.client, batch[i][0]) for i in missing}
            _check(await nodes.on_nodes([(n, resp.command(b"SCRIPT", b"LOAD", r.script.encode()))
                                         for n in where for r in RAW_SCRIPTS]))
            again = await nodes.on_slots(self.client, [batch[i] for i in missing], retry)
            for i, r in zip(missing, again, strict=True):
                res[i] = r
        return res

    async def wave(self, batch: list[tuple[int, bytes]], retry: bool = False) -> list[Any]:
        """:meth:`wave_replies`, an error reply raised."""
        return _check(await self.wave_replies(batch, retry))

    async def ctl(self, script: RawScript, key: str, args: Sequence[Any],
                  reads: Sequence[bytes] = ()) -> tuple[Any, dict[bytes, bytes | None]]:
        """``script``'s reply on the control slot (KEYS = [key]) and, in the same parallel
        round trip, key -> value of the block keys ``reads`` (one MGET per tag)."""
        by: dict[int, list[bytes]] = {}
        for k in reads:
            by.setdefault(k[1], []).append(k)
        res = await self.wave(
            [(CTL_SLOT, script.call(key.encode(), [_b(a) for a in args]))]
            + [(SLOT_OF_BYTE[t], resp.command(b"MGET", *ks)) for t, ks in by.items()])
        return res[0], {k: v for ks, vals in zip(by.values(), res[1:], strict=True)
                        for k, v in zip(ks, vals, strict=True)}

    # --- registration and heartbeats: control slot only -------------------------------

    async def register(self, record: WorkerRecord, live_after_ms: int | None = None) -> bool:
        had = await self._register_call(record, live_after_ms)
        if had == -2:  # the control slot has no generation: recover, then register
            async with self._guard():
                await self.upkeep.recover()
            had = await self._register_call(record, live_after_ms)
            if had == -2:
                raise IndexUnavailable("the index is being recovered (control slot lost)")
        if had == -1:
            raise WorkerIdInUse(record.worker_id)
        self._ns_of[record.worker_id] = record.ns
        return bool(had)

    # --- events ---------------------------------------------------------------------------

    async def apply_events(self, worker_id: str, events: Sequence[IndexEvent],
                           incarnation: int = 0, cap: BlockCap = BlockCap()) -> ApplyResult:
        if not events:
            return await super().apply_events(worker_id, events, incarnation, cap)
        # per event: seq, kind, tier bits, parent key (None: a chain start), block keys
        plan: list[tuple[int, bytes, int, bytes | None, list[bytes]]] = []
        net, cleared, parents, width = 0, [], set(), len(block_key(bytes(32)))
        for ev in events:
            op = ev.op
            if isinstance(op, IndexStored):
                ks = [block_key(h) for h in op.hashes]
                pk = block_key(op.parent) if op.parent else None
                if pk is not None:
                    parents.add(pk)
                plan.append((ev.seq, b"S", tier_bit(op.tier), pk, ks))
                net += len(ks)
            elif isinstance(op, IndexRemoved):
                ks = [block_key(h) for h in op.hashes]
                plan.append((ev.seq, b"R", tier_bit(op.tier), None, ks))
                net -= len(ks)
            elif isinstance(op, IndexCleared):
                plan.append((ev.seq, b"C", 0, None, []))
                cleared.append(str(ev.seq))
                continue
            if ks:
                width = len(ks[0])
        token = secrets.token_hex(8)
        plist = list(parents)
        for fresh in (False, True):
            ns = await self._ns(worker_id, fresh)
            if ns is None:
                return ApplyResult(ApplyStatus.UNKNOWN_WORKER, 0, 0)
            rk = worker_key(ns, worker_id)
            args = [ns, worker_id, events[0].seq, events[-1].seq, str(incarnation),
                    cap.per_pool, cap.floor, net, token, " ".join(cleared)]
            async with self._guard():
                begin, pvals = await self.ctl(APPLY_BEGIN, rk, args, plist)
            if int(begin[0]) != -2:
                break
        if int(begin[0]) != 1:
            return self._answer(worker_id, incarnation, int(begin[0]), begin)
        last, ticket = int(begin[1]), _b(begin[2])
        hs = [int(h) for h in begin[3:]]
        hbs = [keys.handle_bytes(h) for h in hs]
        parts, applied = self._plan_writes(plan, last, hbs, pvals)
        head = [_b(width), b"".join(hbs), _b(len(hs)), ticket]
        busy = [f"{h}:{token}" for h in hs]
        async with self._guard():
            d = await node_waves.write(self, head, parts, width)
            end, _ = await self.ctl(APPLY_END, rk, [
                ns, worker_id, token, str(incarnation), events[-1].seq, d, cap.per_pool,
                cap.floor, *busy])
        if int(end[0]) == 1:
            return ApplyResult(ApplyStatus.OK, applied, int(end[2]))
        return self._answer(worker_id, incarnation, int(end[0]), end)

    @staticmethod
    def _answer(worker_id: str, incarnation: int, status: int, res: list[Any]) -> ApplyResult:
        """The result (or exception) of an APPLY step's answer other than success."""
        if status == -3:
            raise StaleIncarnation(worker_id, incarnation)
        if status == -4:
            raise OverCap(worker_id, int(res[1]), dropped=bool(int(res[2])))
        kind = {0: ApplyStatus.DUPLICATE, -1: ApplyStatus.GAP}.get(
            status, ApplyStatus.UNKNOWN_WORKER)
        return ApplyResult(kind, 0, int(res[2]))

    @staticmethod
    def _plan_writes(plan: list[tuple[int, bytes, int, bytes | None, list[bytes]]], last: int,
                     hbs: list[bytes], pvals: dict[bytes, bytes | None],
                     ) -> tuple[list[node_waves.Part], int]:
        """The fresh events as ``NODE_WRITE`` parts (kind, handle index, tier bits, keys),
        orphans left out, and how many events are fresh. The orphan check follows APPLY:
        a stored event whose parent this worker's current handle does not hold at that
        point of the batch is skipped; the parents' bits are tracked from the values read
        before the batch."""
        tracked = {pk: _bits(v, hbs[0]) for pk, v in pvals.items()}
        parts: list[node_waves.Part] = []
        seg, applied = 1, 0
        for seq, kind, bits, pk, ks in plan:
            if seq <= last:
                continue
            applied += 1
            if kind == b"C":
                seg += 1
                tracked = dict.fromkeys(tracked, 0)
                continue
            if kind == b"S":
                if pk is not None and not tracked[pk]:
                    continue
                for k in ks:
                    if k in tracked:
                        tracked[k] |= bits
            else:
                for k in ks:
                    if k in tracked:
                        tracked[k] &= ~bits
            if ks:
                parts.append((kind, _b(seg), _b(bits), ks))
        return parts, applied

    async def sync_worker(self, worker_id: str, seq: int, blocks: Sequence[IndexStored],
                          incarnation: int = 0, cap: BlockCap = BlockCap()) -> int | None:
        resolved = resolve_snapshot(blocks)
        count, token = len(resolved), secrets.token_hex(8)
        for fresh in (False, True):
            ns = await self._ns(worker_id, fresh)
            if ns is None:
                return None
            rk = worker_key(ns, worker_id)
            async with self._guard():
                begin, _ = await self.ctl(SYNC_BEGIN, rk, [
                    ns, worker_id, str(incarnation), cap.per_pool, cap.floor, count, token,
                    seq])
            if int(begin[0]) != -1:
                break
        n = int(begin[0])
        if n == -1:
            return None
        if n == -2:
            raise StaleIncarnation(worker_id, incarnation)
        if n <= -3:
            raise OverCap(worker_id, -3 - n)
        h, gen, ticket = int(begin[1]), begin[2], _b(begin[3])
        by: dict[int, list[bytes]] = {}
        for hsh, (_, mask) in resolved.items():
            by.setdefault(mask, []).append(block_key(hsh))
        parts = [(b"S", b"1", _b(mask), ks) for mask, ks in by.items()]
        width = len(block_key(next(iter(resolved)))) if resolved else 35
        head = [_b(width), keys.handle_bytes(h), b"1", ticket]
        async with self._guard():
            await node_waves.write(self, head, parts, width)
            end, _ = await self.ctl(SYNC_END, rk, [token, str(incarnation), count, gen,
                                                   f"{h}:{token}"])
            n = int(end)
        if n == -1:
            return None
        if n == -2:
            raise StaleIncarnation(worker_id, incarnation)
        if n == -4:
            raise IndexUnavailable(f"the snapshot of {worker_id!r} was superseded by another")
        return n

    async def sweep(self, max_steps: int = 64) -> int:
        """Check the shards (one back empty or older: every worker resyncs; a lost control
        slot: recovery), then up to ``max_steps`` sweep steps (``cluster_upkeep.py``)."""
        async with self._guard():
            await self.upkeep.check_shards()
            return await self.upkeep.sweep(max_steps)

    # --- lookup ---------------------------------------------------------------------------

    async def lookup(self, ns: str, hashes: Sequence[bytes], now_ms: int,
                     workers: Collection[str] | None = None) -> dict[str, BlockMatch]:
        """One parallel round trip (see the module contract); as ``RedisBackend.lookup``,
        one more when the live map's version moved or the provisional marker appeared."""
        if not hashes:
            return {}
        lk, marker = live_key(ns).encode(), prov_marker(ns).encode()
        cached = self._live.get(ns)
        with_prov = self._prov_seen.get(ns, False)
        for attempt in range(3):
            full = cached is None or attempt > 0
            head = [(CTL_SLOT, resp.command(b"HGETALL", lk) if full
                     else resp.command(b"HGET", lk, b"v")),
                    (CTL_SLOT, resp.command(b"EXISTS", marker))]
            async with self._guard():
                res, values, pvalues = await node_waves.read(self, head, hashes,
                                                             ns if with_prov else "")
            stale = not full and res[0] != cached[0]  # type: ignore[index]
            if full:
                cached = self._live[ns] = keys.live_map(res[0])
            if not stale and (with_prov or not res[1]):
                break
            with_prov = with_prov or bool(res[1])
        self._prov_seen[ns] = bool(res[1])
        if not res[1]:
            pvalues = None
        assert cached is not None
        return walk(values, pvalues, cached[1], now_ms, workers)

    async def add_provisional(self, ns: str, hashes: Sequence[bytes], worker_id: str,
                              start: int, now_ms: int, ttl_ms: int) -> None:
        if start >= len(hashes):
            return
        pks = [keys.prov_key(ns, h) for h in hashes[start:]]
        head = [worker_id.encode(), _b(now_ms + ttl_ms), _b(now_ms), _b(ttl_ms),
                _b(len(pks[0]))]
        marker = (CTL_SLOT, resp.command(b"SET", prov_marker(ns).encode(), b"1", b"PX",
                                         _b(ttl_ms)))
        async with self._guard():
            await node_waves.provisional(self, pks, head, [marker])
