"""The redis backend on a multi-shard Redis Cluster: every command touches one slot, and
what touches many is split per node (``RedisBackend.from_url`` picks this class for a
``redis+cluster://`` URL).

Same keys and answers as the single-server and memory backends. A lookup is one parallel
round trip; a batch three (begin on the worker's lane, a wave of per-node writes, end on
the lane: ``lanes.py``, ``node_waves.py``), so no slot sees every batch; a snapshot adds
a handle's draw on the control slot. A lookup racing a batch can only see a match cut
short, never a block the worker did not hold. A step that fails midway leaves ``pend``
set, so the worker resyncs.

See docs/architecture.md#redis-cluster-details.
"""
from __future__ import annotations

import secrets
from collections.abc import Collection, Sequence
from typing import Any

import redis.exceptions as rexc
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from service.index import cluster_upkeep, lanes, node_waves, nodes
from service.index.base import (
    ApplyResult,
    ApplyStatus,
    BlockCap,
    BlockMatch,
    IndexCleared,
    IndexEvent,
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
from service.index.group_commit import GroupCommit
from service.index.redis import RedisBackend, keys, lua, resp
from service.index.redis.keys import block_key, live_key, prov_marker
from service.index.redis.lua import RawScript
from service.index.redis.walk import walk

__all__ = ["CTL_SLOT", "SLOT_OF_BYTE", "TAG_SLOTS", "ClusterBackend"]

CTL_SLOT = key_slot(keys.REGISTRY.encode())
TAG_SLOTS = [key_slot(bytes([t])) for t in keys.TAGS]  # by tag index
SLOT_OF_BYTE = node_waves.SLOT_OF_BYTE
# The scripts called by SHA inside hand-packed batches (``nodes.py``): the per-node and
# per-tag steps (``node_waves.py``), the lane's steps and the control slot's handle draw
# and heartbeat (``lanes.py``; sent without redis-py's cluster command path, which cost
# more than the step itself). A node that answers ``NOSCRIPT`` gets every one of them
# loaded and the calls sent again (:meth:`ClusterBackend.wave_replies`).
RAW_SCRIPTS = tuple(lua.raw(f"cluster_{n}") for n in (
    "node_write", "tag_clean", "prov_keys", "apply_begin", "apply_end", "sync_end",
    "lane_reset", "lane_beat", "handle", "heartbeat", "tag_fence", "tag_identity"))
NODE_WRITE = TAG_WRITE = node_waves.NODE_WRITE  # one tag's write: a node's, of one tag
APPLY_BEGIN, APPLY_END = lanes.APPLY_BEGIN, lanes.APPLY_END


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
        self._lost = script(lua.text("cluster_lost"))
        self._sweep_begin = script(lua.text("cluster_sweep_begin"))
        self._sweep_step = script(lua.text("cluster_sweep_step"))
        self.upkeep = cluster_upkeep.Upkeep(self)
        self.gen: bytes | None = None  # the shards' generation as last read (lanes.py)
        # batches' node writes, merged when two waves are in flight already
        self.writes: GroupCommit[tuple[int, node_waves.Batch], int] = GroupCommit(
            lambda batches: node_waves.write_all(self, batches))

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

    async def step(self, script: RawScript, slot: int, key: bytes, args: Sequence[Any],
                   reads: Sequence[bytes] = ()) -> tuple[Any, dict[bytes, bytes | None]]:
        """``script``'s reply on ``slot`` (KEYS = [key]) and, in the same parallel round
        trip, key -> value of the block keys ``reads`` (one MGET per tag)."""
        by: dict[int, list[bytes]] = {}
        for k in reads:
            by.setdefault(k[1], []).append(k)
        res = await self.wave(
            [(slot, script.call(key, [resp.arg(a) for a in args]))]
            + [(SLOT_OF_BYTE[t], resp.command(b"MGET", *ks)) for t, ks in by.items()])
        return res[0], {k: v for ks, vals in zip(by.values(), res[1:], strict=True)
                        for k, v in zip(ks, vals, strict=True)}

    # --- registration and heartbeats ------------------------------------------------------

    async def register(self, record: WorkerRecord, live_after_ms: int | None = None) -> bool:
        res = await self._register_call(record, live_after_ms)
        if res == -2:  # the control slot has no generation: recover, then register
            async with self._guard():
                await self.upkeep.recover()
            res = await self._register_call(record, live_after_ms)
            if res == -2:
                raise IndexUnavailable("the index is being recovered (control slot lost)")
        if res == -1:
            raise WorkerIdInUse(record.worker_id)
        had, h, ticket, gen = res
        self._ns_of[record.worker_id] = record.ns
        self.gen = resp.arg(gen)
        d = lanes.Draw(1, int(h), resp.arg(ticket), self.gen,
                       resp.arg(record.load.total_blocks), resp.arg(record.load.tier_blocks))
        async with self._guard():
            await lanes.reset(self, record.ns, record.worker_id, record.incarnation, d, 0,
                              gen=d.gen)
        return bool(int(had))

    async def _beat(self, ns: str, worker_id: str, args: list[Any], load: WorkerLoad
                    ) -> tuple[int, int, int]:
        return await lanes.beat(self, ns, worker_id, args, load.total_blocks, load.tier_blocks)

    async def purge_worker(self, worker_id: str, heartbeat_before_ms: int | None = None) -> bool:
        ns = await self._ns(worker_id, fresh=True)
        done = await super().purge_worker(worker_id, heartbeat_before_ms)
        if done and ns is not None:
            async with self._guard():
                await self.client.delete(keys.lane_key(ns, worker_id))
        return done

    # --- events ---------------------------------------------------------------------------

    async def apply_events(self, worker_id: str, events: Sequence[IndexEvent],
                           incarnation: int = 0, cap: BlockCap = BlockCap()) -> ApplyResult:
        """The batch cut at each AllBlocksCleared event (which draws a fresh handle), each
        run applied by its lane's steps (see ``lanes.py``); answered as one batch."""
        if not events:
            return await super().apply_events(worker_id, events, incarnation, cap)
        runs: list[list[IndexEvent]] = [[]]
        for ev in events:
            if isinstance(ev.op, IndexCleared):
                runs += [[ev], []]  # a run of its own
            else:
                runs[-1].append(ev)
        applied, last = 0, 0
        for run in filter(None, runs):
            res = await self._apply_run(worker_id, run, incarnation, cap)
            if res.status not in (ApplyStatus.OK, ApplyStatus.DUPLICATE):
                return res
            applied, last = applied + res.applied, res.last_seq
        return ApplyResult(ApplyStatus.OK if applied else ApplyStatus.DUPLICATE, applied, last)

    async def _apply_run(self, worker_id: str, events: Sequence[IndexEvent], incarnation: int,
                         cap: BlockCap) -> ApplyResult:
        """One run of a batch: events without AllBlocksCleared, or one such event alone."""
        plan: node_waves.Plan = []  # per event: seq, kind, tier bits, parent key, block keys
        net, parents, width = 0, set(), len(block_key(bytes(32)))
        for ev in events:
            op = ev.op
            if isinstance(op, IndexCleared):
                plan.append((ev.seq, b"C", 0, None, []))
                continue
            ks = [block_key(h) for h in op.hashes]
            if isinstance(op, IndexStored):
                pk = block_key(op.parent) if op.parent else None
                if pk is not None:
                    parents.add(pk)
                plan.append((ev.seq, b"S", tier_bit(op.tier), pk, ks))
                net += len(ks)
            else:
                plan.append((ev.seq, b"R", tier_bit(op.tier), None, ks))
                net -= len(ks)
            if ks:
                width = len(ks[0])
        token, plist = secrets.token_hex(8), list(parents)
        begin: Any = None
        for attempt in range(2):  # again once: the registry or the generation read anew
            ns = await self._ns(worker_id, attempt > 0)
            if ns is None:
                return ApplyResult(ApplyStatus.UNKNOWN_WORKER, 0, 0)
            if self.gen is None:
                await lanes.read_gen(self)
            slot, lk = lanes.lane(ns, worker_id)
            args = [events[0].seq, events[-1].seq, str(incarnation), cap.per_pool, cap.floor,
                    net, token, self.gen]
            async with self._guard():
                begin, pvals = await self.step(APPLY_BEGIN, slot, lk, args, plist)
            status = int(begin[0])
            if status == -5 and attempt == 0 and self.gen != await lanes.read_gen(self):
                continue  # the service's generation was old: read again, begin again
            if status != -2 or attempt > 0:
                break
        if status == -2:  # no lane, yet registered: the lane's shard was lost, resync
            return ApplyResult(ApplyStatus.GAP, 0, 0)
        if status != 1:
            return self._answer(worker_id, incarnation, -1 if status == -5 else status, begin)
        last, ticket, h = int(begin[1]), resp.arg(begin[2]), int(begin[3])
        if plan[0][1] == b"C":  # a fresh handle for an AllBlocksCleared, seq its own
            async with self._guard():
                d = await lanes.draw(self, ns, worker_id, incarnation, cap)
                if d.status == 1:
                    await lanes.reset(self, ns, worker_id, incarnation, d, plan[0][0], gen=d.gen)
            if d.status == -2:
                raise StaleIncarnation(worker_id, incarnation)
            if d.status != 1:
                return ApplyResult(ApplyStatus.UNKNOWN_WORKER, 0, 0)
            return ApplyResult(ApplyStatus.OK, 1, plan[0][0])
        hb = keys.handle_bytes(h)
        parts, applied = node_waves.plan(plan, last, hb, pvals)
        async with self._guard():
            d = await self.writes.submit((width, (hb, ticket, parts)))
            end, _ = await self.step(APPLY_END, slot, lk, [
                token, str(incarnation), events[-1].seq, d, cap.per_pool, cap.floor])
        if int(end[0]) == 1:
            return ApplyResult(ApplyStatus.OK, applied, int(end[2]))
        if int(end[0]) == -2:  # the lane was lost with its shard midway: resync
            return ApplyResult(ApplyStatus.GAP, 0, 0)
        if int(end[0]) == -4:  # the backstop: a fresh handle drops every entry of this one
            async with self._guard():
                fresh = await lanes.draw(self, ns, worker_id, incarnation, BlockCap())
                if fresh.status == 1:
                    await lanes.reset(self, ns, worker_id, incarnation, fresh, 0,
                                      gen=fresh.gen)
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

    async def sync_worker(self, worker_id: str, seq: int, blocks: Sequence[IndexStored],
                          incarnation: int = 0, cap: BlockCap = BlockCap()) -> int | None:
        """A fresh handle drawn (control slot), the lane reset to it with pend set, the
        blocks written, the lane's end step (``lanes.py``)."""
        resolved = resolve_snapshot(blocks)
        count, token = len(resolved), secrets.token_hex(8)
        for fresh in (False, True):
            ns = await self._ns(worker_id, fresh)
            if ns is None:
                return None
            async with self._guard():
                d = await lanes.draw(self, ns, worker_id, incarnation, cap, count)
            if d.status != -1:
                break
        if d.status == -1:
            return None
        if d.status == -2:
            raise StaleIncarnation(worker_id, incarnation)
        if d.status <= -3:
            raise OverCap(worker_id, -3 - d.status)
        by: dict[int, list[bytes]] = {}
        for hsh, (_, mask) in resolved.items():
            by.setdefault(mask, []).append(block_key(hsh))
        parts = [(b"S", resp.arg(mask), ks) for mask, ks in by.items()]
        width = len(block_key(next(iter(resolved)))) if resolved else 35
        slot, lk = lanes.lane(ns, worker_id)
        async with self._guard():
            if not await lanes.reset(self, ns, worker_id, incarnation, d, seq, pend=token):
                raise IndexUnavailable(f"the snapshot of {worker_id!r} was superseded by another")
            await node_waves.write(self, width, [(keys.handle_bytes(d.handle), d.ticket, parts)])
            end, _ = await self.step(lanes.SYNC_END, slot, lk,
                                     [token, str(incarnation), count, d.gen])
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
        head = [worker_id.encode(), resp.arg(now_ms + ttl_ms), resp.arg(now_ms), resp.arg(ttl_ms)]
        marker = (CTL_SLOT, resp.command(b"SET", prov_marker(ns).encode(), b"1", b"PX",
                                         resp.arg(ttl_ms)))
        async with self._guard():
            await node_waves.provisional(self, ns, hashes[start:], head, [marker])

    # --- reads of records: the lane's seq and entries ---------------------------------

    async def workers(self, with_blocks: bool = False) -> list[WorkerRecord]:
        out = await super().workers(with_blocks)
        await self._with_lanes(out, with_blocks)
        return out

    async def get_worker(self, worker_id: str) -> WorkerRecord | None:
        rec = await super().get_worker(worker_id)
        if rec is not None:
            await self._with_lanes([rec], False)
        return rec

    async def _with_lanes(self, recs: list[WorkerRecord], with_blocks: bool) -> None:
        """Each record's last seq (and entries) from its lane (0 without one)."""
        async with self._guard():
            got = await lanes.seqs(self, [(r.worker_id, r.ns) for r in recs])
        for r, lane in zip(recs, got, strict=True):
            r.last_seq, n = lane or (0, 0)
            if with_blocks:
                r.indexed_blocks = n
