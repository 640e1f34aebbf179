"""Upkeep of the index on a multi-shard Redis Cluster, run by every service replica's
janitor each second (``ClusterBackend.sweep``).

:meth:`Upkeep.check_shards` moves the generation when a shard came back empty or older;
:meth:`Upkeep.recover` rebuilds a lost control slot (under a lock, before any registration);
:meth:`Upkeep.sweep` is the single-server sweep split per slot, fenced and layout-checked.
Costs one command when nothing was retired.

See docs/architecture.md#redis-cluster-details.
"""
from __future__ import annotations

import logging
import secrets
import time
from typing import TYPE_CHECKING

from service.index import nodes, shard_identity
from service.index.base import IndexUnavailable
from service.index.handle_fence import TICKET, fence_key
from service.index.redis import keys, lua, resp
from service.index.sweep_layout import step_layout

if TYPE_CHECKING:
    from service.index.cluster import ClusterBackend

__all__ = ["GEN", "SENTINELS", "Upkeep"]

log = logging.getLogger(__name__)

GEN = shard_identity.GEN
RECOVER = keys.CTL + "recover"
RECOVER_MS = 60_000
SENTINELS = shard_identity.SENTINELS
_NODES = resp.command(b"CLUSTER", b"NODES")


SCAN_COUNT = 1000
_KEY_LENGTHS = (19, 35)  # '{T}' + a 16- or 32-byte hash
TAG_FENCE, TAG_CLEAN = lua.raw("cluster_tag_fence"), lua.raw("cluster_tag_clean")


class Upkeep:
    """The janitor's work for one :class:`ClusterBackend` (see the module contract)."""

    def __init__(self, backend: ClusterBackend) -> None:
        self.b = backend
        self._sweep_fenced = backend.client.register_script(lua.text("cluster_sweep_fenced"))

    async def check_shards(self) -> None:
        if not await shard_identity.check(self.b):
            await self.recover()

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
            await self._restart_tickets()
            await shard_identity.stamp_all(self.b)
            await client.set(GEN, f"{time.time_ns()}.{token}", nx=True)
            if dropped:
                log.warning("index: the control slot was lost; %d block keys deleted, "
                            "workers register and resync", dropped)
        finally:
            if await client.get(RECOVER) == token:
                await client.delete(RECOVER)

    async def _restart_tickets(self) -> None:
        """The ticket counter started at the server time in microseconds, and every tag's
        fence floor there (``handle_fence.py``: no ticket of the lost counter passes)."""
        from service.index.cluster import TAG_SLOTS

        start = await self.b.client.eval(lua.text("cluster_ticket_start"), 1, TICKET)
        await self.b.wave([(TAG_SLOTS[i], TAG_FENCE.call(fence_key(i), [b"*", resp.arg(start)]))
                           for i in range(keys.N_TAGS)])

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
        from service.index.cluster import SLOT_OF_BYTE, TAG_SLOTS

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
            gone = b"".join(keys.handle_bytes(int(h)) for h in cycle)
            if state.get("f") != "1":  # fence every tag before the first scan step
                await self.b.wave([(TAG_SLOTS[i], TAG_FENCE.call(
                    fence_key(i), [gone, state["tc"].encode()])) for i in range(keys.N_TAGS)])
                await self._sweep_fenced([keys.SWEEP], [cycle_id])
                continue
            todo = {n for n in names if state.get(n) != "done"}
            batch: list[tuple[object, bytes]] = []
            for n in names:
                batch.append((primaries[n], _NODES))
                if n in todo:
                    batch.append((primaries[n], resp.command(
                        b"SCAN", state.get(n, "0").encode(), b"MATCH", keys.BLOCK_KEYS_MATCH,
                        b"COUNT", str(SCAN_COUNT).encode())))
                batch.append((primaries[n], _NODES))
            replies = iter(await nodes.on_nodes(batch, retry=True))  # type: ignore[arg-type]
            step: list[str] = []
            by: dict[int, list[bytes]] = {}
            for n in names:
                before = next(replies)
                cursor, found = next(replies) if n in todo else (b"", [])
                lay = step_layout(before, next(replies), TAG_SLOTS)
                step += [n, state.get(n, "0"), cursor.decode(), lay]
                for k in found if lay else ():  # an unstable node's scan starts over
                    if len(k) in _KEY_LENGTHS and k[1] in SLOT_OF_BYTE and k[2] == 0x7D:
                        by.setdefault(k[1], []).append(k)
            res = await self.b.wave([(SLOT_OF_BYTE[t], TAG_CLEAN.call(ks[0], [gone, *ks]))
                                     for t, ks in by.items()])
            dropped += sum(int(r) for r in res)
            if int(await self.b._sweep_step([keys.SWEEP],
                                            [cycle_id, state.get("c", ""), *step])) == 2:
                break
        return dropped
