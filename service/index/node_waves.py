"""A batch's per-tag parts sent as one script call per node of a Redis Cluster, and a
lookup's reads.

A batch touches up to 64 tags, but a cluster has a few primaries: one script call per tag
cost every shard a script's fixed cost per tag per batch, whatever the entries. Here each
node gets one call holding all of its tags' parts (``cluster_node_write``, and
``cluster_prov_keys`` for a route's provisional entries), so a shard's work per batch is
one call, one read per tag (its fences with its keys) and a write per key it holds.

Contract: the grouping follows the client's slot map. A write call that meets a slot its
node no longer serves fails before it changes anything (the script reads every key before
it writes one), and its parts are sent again one tag at a time (each routed by its
own key, a ``MOVED`` followed by ``nodes.on_slots``) after the slot map is read again; the
counts come back as if each tag had been called alone. Provisional keys are set one at a
time (idempotent), so a call that failed part way is sent again the same way.

See docs/architecture.md#redis-cluster-details.
"""
from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import numpy as np
import redis.exceptions as rexc
from redis.crc import key_slot

from service.index.redis import keys, lua, resp

if TYPE_CHECKING:
    from service.index.cluster import ClusterBackend

__all__ = ["NODE_WRITE", "Batch", "Part", "Plan", "SLOT_OF_BYTE", "by_node", "plan",
           "provisional", "read", "write", "write_all"]

NODE_WRITE, PROV_KEYS = lua.raw("cluster_node_write"), lua.raw("cluster_prov_keys")
Part = tuple[bytes, bytes, list[bytes]]  # an event's writes: kind, tier bits, block keys
Batch = tuple[bytes, bytes, Sequence[Part]]  # a batch's handle (3 bytes), ticket, parts
Plan = list[tuple[int, bytes, int, bytes | None, list[bytes]]]  # seq, kind, bits, parent, keys
SLOT_OF_BYTE = {t: key_slot(bytes([t])) for t in keys.TAGS}  # by the tag byte of a key


def _bits(value: bytes | None, hb: bytes) -> int:
    """The tier bits of handle ``hb``'s entry in a block value (0: none)."""
    if value:
        for i in range(0, len(value), keys.ENTRY_BYTES):
            if value[i:i + 3] == hb:
                return value[i + 3]
    return 0


def plan(events: Plan, last: int, hb: bytes, pvals: dict[bytes, bytes | None],
         ) -> tuple[list[Part], int]:
    """The fresh events as ``NODE_WRITE`` parts (kind, tier bits, keys), orphans left
    out, and how many events are fresh. The orphan check follows APPLY:
    a stored event whose parent handle ``hb`` does not hold at that point of the batch
    is skipped; the parents' bits are tracked from the values read before the batch."""
    tracked = {pk: _bits(v, hb) for pk, v in pvals.items()}
    parts: list[Part] = []
    applied = 0
    for seq, kind, bits, pk, ks in events:
        if seq <= last:
            continue
        applied += 1
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
            parts.append((kind, resp.arg(bits), ks))
    return parts, applied


async def by_node(b: ClusterBackend, tags: Sequence[int]) -> list[list[int]]:
    """``tags`` (tag bytes) grouped by the primary serving each one's slot, order kept."""
    await b.client.initialize()  # a no-op once the slot map is known
    nm = b.client.nodes_manager
    out: dict[str, list[int]] = {}
    for t in tags:
        out.setdefault(nm.get_node_from_slot(SLOT_OF_BYTE[t]).name, []).append(t)
    return list(out.values())


def _failed(r: Any) -> bool:
    """A node call that failed without a change (see the module contract); anything but
    a missing script (``ClusterBackend.wave_replies`` loads those) or an answer."""
    return isinstance(r, rexc.ResponseError) and not isinstance(r, rexc.NoScriptError)


async def _again(b: ClusterBackend) -> None:
    await b.client.nodes_manager.initialize()  # a slot moved: read the map again


def _split(parts: Sequence[tuple[bytes, bytes, bytes, list[bytes]]], where: dict[int, int],
           n: int) -> list[list[bytes]]:
    """``NODE_WRITE``'s ARGV[4..] for each of ``n`` destinations from ``parts`` (kind, batch
    index, bits, keys), ``where`` mapping a tag byte to its destination: each event's keys
    split, event order kept."""
    out: list[list[bytes]] = [[] for _ in range(n)]
    for kind, seg, bits, ks in parts:
        by: dict[int, list[bytes]] = {}
        for k in ks:
            by.setdefault(where[k[1]], []).append(k)
        for i, dks in by.items():
            out[i] += (kind, seg, bits, b"".join(dks))
    return out


async def write(b: ClusterBackend, width: int, batches: Sequence[Batch]) -> list[int]:
    """Apply the events of ``batches`` (each: its handle, its ticket, its parts; keys of
    ``width`` bytes), one call per node for all of them; per batch, its handle's entries
    added minus removed."""
    head = [resp.arg(width), b"".join(hb for hb, _, _ in batches),
            b",".join(tk for _, tk, _ in batches)]
    parts = [(kind, resp.arg(i), bits, ks) for i, (_, _, ps) in enumerate(batches, 1)
             for kind, bits, ks in ps]
    tags = sorted({k[1] for *_, ks in parts for k in ks})
    groups = await by_node(b, tags)
    args = _split(parts, {t: i for i, g in enumerate(groups) for t in g}, len(groups))
    res = await b.wave_replies([(SLOT_OF_BYTE[g[0]], NODE_WRITE.call(a[3][:width], head + a))
                                for g, a in zip(groups, args, strict=True)])
    for r in res:
        if isinstance(r, Exception) and not _failed(r):
            raise r
    again = [t for g, r in zip(groups, res, strict=True) if _failed(r) for t in g]
    total = [0] * len(batches)
    for r in res:
        if not isinstance(r, Exception):
            total = [t + int(x) for t, x in zip(total, r, strict=True)]
    if again:
        await _again(b)
        mine = set(again)
        per_tag = _split([(k, s, x, [y for y in ks if y[1] in mine]) for k, s, x, ks in parts],
                         {t: i for i, t in enumerate(again)}, len(again))
        for r in await b.wave([(SLOT_OF_BYTE[t], NODE_WRITE.call(a[3][:width], head + a))
                               for t, a in zip(again, per_tag, strict=True)]):
            total = [t + int(x) for t, x in zip(total, r, strict=True)]
    return total


async def write_all(b: ClusterBackend, batches: Sequence[tuple[int, Batch]]) -> list[int]:
    """:func:`write` of ``batches`` (key width, batch), one wave per key width (the hash
    algorithms of their workers), the counts in the order given."""
    out = [0] * len(batches)
    by: dict[int, list[int]] = {}
    for i, (width, _) in enumerate(batches):
        by.setdefault(width, []).append(i)
    for width, idx in by.items():
        got = await write(b, width, [batches[i][1] for i in idx])
        for i, d in zip(idx, got, strict=True):
            out[i] = d
    return out


def _tag_runs(hashes: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray, list[int], list[int]]:
    """``hashes`` as rows sorted by tag (stable), the order taken, the runs' bounds and
    each run's tag byte."""
    raw = np.frombuffer(b"".join(hashes), np.uint8).reshape(len(hashes), -1)
    tag = raw[:, 0] % keys.N_TAGS
    order = np.argsort(tag, kind="stable")
    ranked = tag[order]
    bounds = [0, *(np.flatnonzero(np.diff(ranked)) + 1).tolist(), len(hashes)]
    return raw[order], order, bounds, [keys.TAGS[t] for t in ranked[bounds[:-1]].tolist()]


def _scatter(inv: list[int], replies: Sequence[list[bytes | None]]) -> list[bytes | None]:
    """The per-tag ``MGET`` replies back in chain order (``inv[p]``: where chain position
    p's value is in the replies, concatenated)."""
    return list(itemgetter(*inv)(list(chain.from_iterable(replies)))) if len(inv) > 1 \
        else list(chain.from_iterable(replies))


async def read(b: ClusterBackend, head: list[tuple[int, bytes]], hashes: Sequence[bytes],
               ns: str) -> tuple[list[Any], list[bytes | None], list[bytes | None] | None]:
    """In one parallel round trip: the replies of ``head`` (commands on their slots) and
    the values of the block keys of ``hashes`` and of their provisional keys of ``ns`` (''
    none), in chain order: one ``MGET`` per tag (both kinds of key share the tag's slot).
    Not a script per node: a Lua read of an 8K-token prompt's keys cost the shards about
    4x the ``MGET``s' time (docs/benchmarks.md)."""
    raw, order, bounds, tags = _tag_runs(hashes)
    slots = [SLOT_OF_BYTE[t] for t in tags]
    cmds = resp.mget_runs(raw, bounds, ns.encode() if ns else None)
    res = await b.wave([*head, *zip(slots, cmds, strict=True)], retry=True)
    n, inv = len(head), np.argsort(order).tolist()
    got = res[n:]
    if not ns:
        return res[:n], _scatter(inv, got), None
    return (res[:n], _scatter(inv, [r[0::2] for r in got]),
            _scatter(inv, [r[1::2] for r in got]))


async def provisional(b: ClusterBackend, ns: str, hashes: Sequence[bytes], head: list[bytes],
                      extra: list[tuple[int, bytes]]) -> None:
    """Set or renew the provisional keys of ``ns`` of ``hashes`` (``cluster_prov_keys``
    with ARGV ``head`` then each node's keys concatenated) and run ``extra`` in the same
    round trip. The script sets one key at a time (idempotent): a node call that failed
    part way is sent again one tag at a time."""
    raw, _, bounds, tags = _tag_runs(hashes)
    rows = resp.key_rows(raw, b"p", ns.encode())
    kw = rows.shape[1]
    per_tag = {t: rows[a:z].tobytes() for t, a, z in zip(
        tags, bounds[:-1], bounds[1:], strict=True)}
    groups = await by_node(b, tags)
    calls = [(SLOT_OF_BYTE[g[0]], PROV_KEYS.call(
        per_tag[g[0]][:kw], [*head, resp.arg(kw), b"".join(per_tag[t] for t in g)]))
        for g in groups]
    res = await b.wave_replies([*calls, *extra])
    for i, r in enumerate(res):
        if isinstance(r, Exception) and (i >= len(calls) or not _failed(r)):
            raise r
    again = [t for g, r in zip(groups, res[:len(calls)], strict=True) if _failed(r) for t in g]
    if again:
        await _again(b)
        await b.wave([(SLOT_OF_BYTE[t], PROV_KEYS.call(per_tag[t][:kw], [
            *head, resp.arg(kw), per_tag[t]])) for t in again])
