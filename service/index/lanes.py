"""A worker's event lane on a Redis Cluster: the state its event batches are ordered by
(seq, incarnation, handle and the handle's ticket, entry count, pend, generation), in one
hash on the worker's own slot (``keys.lane_key``), not in the control slot.

Contract: an event batch touches its lane and the shards holding its keys, nothing else,
so no slot sees every batch: begin and end are lane steps (``cluster_apply_begin``,
``cluster_apply_end``) and the wave between them writes with the lane's handle and ticket.
The control slot is touched only where a handle is drawn (a registration, a snapshot, an
AllBlocksCleared event, the cap's backstop: ``cluster_handle`` draws it with a ticket,
then ``cluster_lane_reset`` points the lane at it; a reset with an older ticket than the
lane's changes nothing, so racing draws land in draw order). The ticket drawn with a
handle is every batch's ticket for that handle: a sweep fences a retired handle with the
ticket counter at its start, which no ticket of that handle reaches (``handle_fence.py``).
The lane keeps the generation it was written under; a batch names the one the service
last read (heartbeats and registrations refresh it), and a lane of another generation is
a gap (the worker resyncs) once the service has read the generation again.

See docs/architecture.md#redis-cluster-details.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.crc import key_slot

from service.index import shard_identity
from service.index.base import BlockCap
from service.index.redis import keys, lua, resp

if TYPE_CHECKING:
    from service.index.cluster import ClusterBackend

__all__ = ["APPLY_BEGIN", "APPLY_END", "BEAT", "HANDLE", "HEARTBEAT", "RESET", "SYNC_END",
           "Draw", "beat", "draw", "lane", "read_gen", "reset",
           "seqs"]

(APPLY_BEGIN, APPLY_END, SYNC_END, RESET, BEAT, HANDLE, HEARTBEAT) = (
    lua.raw(f"cluster_{n}") for n in ("apply_begin", "apply_end", "sync_end", "lane_reset",
                                      "lane_beat", "handle", "heartbeat"))
GEN = shard_identity.GEN


def lane(ns: str, worker_id: str) -> tuple[int, bytes]:
    """(slot, key) of a worker's lane."""
    lk = keys.lane_key(ns, worker_id).encode()
    return key_slot(lk), lk


@dataclass(frozen=True, slots=True)
class Draw:
    """A handle drawn for a worker: ``status`` 1 (drawn) and the handle, the ticket drawn
    with it, the generation and the cap's pool sizes; or -1 unknown, -2 stale, <= -3 over
    the cap (nothing drawn)."""

    status: int
    handle: int = 0
    ticket: bytes = b""
    gen: bytes = b""
    total: bytes = b"0"
    tiers: bytes = b"0"

    @classmethod
    def of(cls, reply: list[Any]) -> Draw:
        """``cluster_handle``'s answer."""
        if int(reply[0]) != 1:
            return cls(int(reply[0]))
        return cls(1, int(reply[1]), *(resp.arg(x) for x in reply[2:6]))


async def draw(b: ClusterBackend, ns: str, worker_id: str, incarnation: int, cap: BlockCap,
               count: int = 0) -> Draw:
    """A fresh handle for the worker (its old one retired), checked against its incarnation
    and, for ``count`` blocks, the cap; see :class:`Draw` (status -1 unknown, -2 stale,
    <= -3 over the cap)."""
    from service.index.cluster import CTL_SLOT

    rk = keys.worker_key(ns, worker_id).encode()
    (r,) = await b.wave([(CTL_SLOT, HANDLE.call(rk, [resp.arg(a) for a in (
        ns, worker_id, incarnation, cap.per_pool, cap.floor, count)]))])
    d = Draw.of(r)
    if d.status == 1:
        b.gen = d.gen
    return d


async def reset(b: ClusterBackend, ns: str, worker_id: str, incarnation: int, d: Draw,
                seq: int, gen: bytes = b"", pend: str = "") -> bool:
    """Point the worker's lane at the drawn handle (``cluster_lane_reset``); False when a
    later draw's reset came first."""
    slot, lk = lane(ns, worker_id)
    args = [resp.arg(incarnation), resp.arg(d.handle), d.ticket, resp.arg(seq), gen,
            pend.encode(), d.total, d.tiers]
    (r,) = await b.wave([(slot, RESET.call(lk, args))])
    return bool(int(r))


async def beat(b: ClusterBackend, ns: str, worker_id: str, args: Sequence[Any],
               total: int, tiers: int) -> tuple[int, int, int]:
    """A heartbeat's two steps in one round trip: (status, last seq, the previous
    heartbeat's reported seq), status 0 unknown, -1 stale, 1 known. Last seq is -1 (the
    service asks for a snapshot) unless the lane names the record's handle, the
    incarnation and the current generation, and no step of it stopped midway."""
    from service.index.cluster import CTL_SLOT

    slot, lk = lane(ns, worker_id)
    rk = keys.worker_key(ns, worker_id).encode()
    hb, ln = await b.wave([(CTL_SLOT, HEARTBEAT.call(rk, [resp.arg(a) for a in args])),
                           (slot, BEAT.call(lk, [resp.arg(total), resp.arg(tiers)]))])
    status = int(hb[0])
    if status != 1:
        return status, 0, 0
    b.gen = resp.arg(hb[3])
    ok = bool(ln) and (resp.arg(ln[0]) == resp.arg(hb[2])
                       and resp.arg(ln[1]) == resp.arg(args[2])
                       and resp.arg(ln[3]) == b.gen and not int(ln[4]))
    return 1, int(ln[2]) if ok else -1, int(hb[1])


async def read_gen(b: ClusterBackend) -> bytes:
    """The shards' generation, read again (a batch met a lane of another one)."""
    b.gen = resp.arg(await b.client.get(GEN) or b"")
    return b.gen


async def seqs(b: ClusterBackend, workers: Sequence[tuple[str, str]]
               ) -> list[tuple[int, int] | None]:
    """(last seq, entries of its handle) of each (worker id, ns)'s lane, None without one;
    one parallel round trip."""
    if not workers:
        return []
    cmds = []
    for wid, ns in workers:
        slot, lk = lane(ns, wid)
        cmds.append((slot, resp.command(b"HMGET", lk, b"seq", b"n")))
    out: list[tuple[int, int] | None] = []
    for r in await b.wave(cmds):
        out.append(None if r[0] is None else (int(r[0]), int(r[1] or 0)))
    return out

