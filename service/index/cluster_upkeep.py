"""Upkeep of the index on a multi-shard Redis Cluster, run by every service replica's
janitor each second (``ClusterBackend.sweep``).

Contract:

- :meth:`Upkeep.check_shards`: one parallel round trip reads the control slot's generation
  ``kvm:{ctl}:gen`` and whether every tag's sentinel ``{T}!`` exists. A sentinel gone means
  its shard came back empty (restarted without persistence, or flushed): ``LOST`` moves
  the generation, so every worker is asked for a snapshot (its next heartbeat or batch:
  ``cluster_scripts.HEARTBEAT`` / ``APPLY_BEGIN``), and the sentinels are set again. Until
  the snapshots land, lookups see the lost blocks as missing (a match cut short, never a
  wrong one). A generation gone means the control slot was lost: :meth:`recover`.
- :meth:`Upkeep.recover` (also run by a registration that finds no generation): under a
  lock (one replica at a time), deletes every block and provisional key of every shard
  (handles are counted from 1 again, so an old entry would count for a new worker), sets
  the sentinels, then the generation; registrations are refused until then.
- :meth:`Upkeep.sweep`: the sweep of ``sweep_script.py`` split per slot: ``SWEEP_BEGIN``
  (control slot) starts a cycle with the retired handles no writer still uses (busy
  ones wait: ``cluster_scripts``), each step ``SCAN``s every primary from its cursor, the
  keys found are cleaned per tag (``TAG_CLEAN``), and ``SWEEP_STEP`` stores each cursor; the
  cycle's handles are free once every primary's scan came back to 0. Costs one command
  when nothing was retired.
"""
from __future__ import annotations

import logging
import secrets
import time
from typing import TYPE_CHECKING

from service.index import keys, nodes, resp
from service.index.base import IndexUnavailable

if TYPE_CHECKING:
    from service.index.cluster import ClusterBackend

__all__ = ["GEN", "SENTINELS", "Upkeep"]

log = logging.getLogger(__name__)

GEN = keys.CTL + "gen"
RECOVER = keys.CTL + "recover"
RECOVER_MS = 60_000
SENTINELS = [b"{" + bytes([t]) + b"}!" for t in keys.TAGS]  # by tag index
SCAN_COUNT = 1000
_KEY_LENGTHS = (19, 35)  # '{T}' + a 16- or 32-byte hash


class Upkeep:
    """The janitor's work for one :class:`ClusterBackend` (see the module contract)."""

    def __init__(self, backend: ClusterBackend) -> None:
        self.b = backend

    async def check_shards(self) -> None:
        from service.index.cluster import CTL_SLOT, TAG_SLOTS

        res = await self.b.wave(
            [(CTL_SLOT, resp.command(b"GET", GEN.encode()))]
            + [(TAG_SLOTS[i], resp.command(b"EXISTS", s)) for i, s in enumerate(SENTINELS)],
            retry=True)
        if res[0] is None:
            await self.recover()
            return
        lost = [i for i, r in enumerate(res[1:]) if not r]
        if not lost:
            return
        if await self.b._lost([GEN], [res[0].decode()]) is None:
            await self.recover()
            return
        await self._set_sentinels(lost)
        log.warning("index: %d of %d block tags came back empty (a shard lost its data): "
                    "every worker resyncs", len(lost), len(SENTINELS))

    async def _set_sentinels(self, tags: list[int]) -> None:
        from service.index.cluster import TAG_SLOTS

        await self.b.wave([(TAG_SLOTS[i], resp.command(b"SET", SENTINELS[i], b"1"))
                           for i in tags])

    async def recover(self) -> None:
        """See the module contract; raises ``IndexUnavailable`` while another replica
        holds the lock."""
        client, token = self.b.client, secrets.token_hex(8)
        if not await client.set(RECOVER, token, nx=True, px=RECOVER_MS):
            raise IndexUnavailable("another service replica is recovering the index")
        try:
            if await client.get(GEN) is not None:
                return
            dropped = 0
            for pattern in (keys.BLOCK_KEYS_MATCH, keys.PROV_KEYS_MATCH):
                dropped += await self._delete_all(pattern)
            await self._set_sentinels(list(range(len(SENTINELS))))
            await client.set(GEN, f"{time.time_ns()}.{token}", nx=True)
            if dropped:
                log.warning("index: the control slot was lost; %d block keys deleted, "
                            "workers register and resync", dropped)
        finally:
            if await client.get(RECOVER) == token:
                await client.delete(RECOVER)

    async def _delete_all(self, pattern: bytes) -> int:
        """UNLINK every key matching ``pattern`` on every primary (per slot); the count."""
        from service.index.cluster import SLOT_OF_BYTE

        await self.b.client.initialize()
        at = 2 if pattern.startswith(b"p") else 1  # where the tag byte is
        dropped = 0
        for node in self.b.client.get_primaries():
            cursor = b"0"
            while True:
                (cursor, found), = await nodes.on_nodes(
                    [(node, resp.command(b"SCAN", cursor, b"MATCH", pattern, b"COUNT",
                                         str(SCAN_COUNT).encode()))], retry=True)
                by: dict[int, list[bytes]] = {}
                for k in found:
                    if len(k) > at + 1 and k[at] in SLOT_OF_BYTE and k[at + 1:at + 2] == b"}":
                        by.setdefault(k[at], []).append(k)
                await self.b.wave([(SLOT_OF_BYTE[t], resp.command(b"UNLINK", *ks))
                                   for t, ks in by.items()])
                dropped += sum(len(ks) for ks in by.values())
                if cursor == b"0":
                    break
        return dropped

    async def sweep(self, max_steps: int) -> int:
        from service.index.cluster import SLOT_OF_BYTE
        from service.index.raw_scripts import TAG_CLEAN

        await self.b.client.initialize()
        primaries = {n.name: n for n in self.b.client.get_primaries()}
        names = sorted(primaries)
        dropped = 0
        for _ in range(max_steps):
            st = await self.b._sweep_begin([keys.SWEEP], names)
            if not st:
                break
            cycle_id, flat, cycle = st
            state = dict(zip(flat[::2], flat[1::2], strict=True))
            todo = [n for n in names if state.get(n) not in (None, "done")]
            if not todo:
                break
            scans = await nodes.on_nodes(
                [(primaries[n], resp.command(b"SCAN", state[n].encode(), b"MATCH",
                                             keys.BLOCK_KEYS_MATCH, b"COUNT",
                                             str(SCAN_COUNT).encode())) for n in todo],
                retry=True)
            by: dict[int, list[bytes]] = {}
            for _, found in scans:
                for k in found:
                    if len(k) in _KEY_LENGTHS and k[1] in SLOT_OF_BYTE and k[2] == 0x7D:
                        by.setdefault(k[1], []).append(k)
            gone = b"".join(keys.handle_bytes(int(h)) for h in cycle)
            res = await self.b.wave([(SLOT_OF_BYTE[t], TAG_CLEAN.call(ks[0], [gone, *ks]))
                                     for t, ks in by.items()])
            dropped += sum(int(r) for r in res)
            done = 0
            for n, (cursor, _) in zip(todo, scans, strict=True):
                done = max(done, int(await self.b._sweep_step(
                    [keys.SWEEP], [cycle_id, n, cursor.decode()])))
            if done == 2:
                break
        return dropped
