"""A batch's per-tag parts sent as one script call per node of a Redis Cluster, and a
lookup's reads.

A batch touches up to 64 tags, but a cluster has a few primaries: one script call per tag
cost every shard a script's fixed cost per tag per batch, whatever the entries. Here each
node gets one call holding all of its tags' parts (``cluster_node_write``, and
``cluster_prov_keys`` for a route's provisional entries), so a shard's work per batch is
one call plus a fence read per tag and a read and a write per key it holds.

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

__all__ = ["NODE_WRITE", "Part", "SLOT_OF_BYTE", "by_node",
           "provisional", "read", "write"]

NODE_WRITE, PROV_KEYS = lua.raw("cluster_node_write"), lua.raw("cluster_prov_keys")
Part = tuple[bytes, bytes, bytes, list[bytes]]  # an event: kind, handle index, bits, keys
SLOT_OF_BYTE = {t: key_slot(bytes([t])) for t in keys.TAGS}  # by the tag byte of a key


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


def _split(parts: Sequence[Part], where: dict[int, int], n: int) -> list[list[bytes]]:
    """``NODE_WRITE``'s ARGV[5..] for each of ``n`` destinations, ``where`` mapping a tag
    byte to its destination: each event's keys split, event order kept."""
    out: list[list[bytes]] = [[] for _ in range(n)]
    for kind, seg, bits, ks in parts:
        by: dict[int, list[bytes]] = {}
        for k in ks:
            by.setdefault(where[k[1]], []).append(k)
        for i, dks in by.items():
            out[i] += (kind, seg, bits, b"".join(dks))
    return out


async def write(b: ClusterBackend, head: list[bytes], parts: Sequence[Part], width: int) -> int:
    """Apply a batch's events (``parts``: kind, handle index, tier bits, keys) with
    ``head`` (``cluster_node_write``'s ARGV[1..4]), one call per node; the counted
    handle's entries added minus removed."""
    tags = sorted({k[1] for *_, ks in parts for k in ks})
    groups = await by_node(b, tags)
    args = _split(parts, {t: i for i, g in enumerate(groups) for t in g}, len(groups))
    res = await b.wave_replies([(SLOT_OF_BYTE[g[0]], NODE_WRITE.call(a[3][:width], head + a))
                                for g, a in zip(groups, args, strict=True)])
    for r in res:
        if isinstance(r, Exception) and not _failed(r):
            raise r
    again = [t for g, r in zip(groups, res, strict=True) if _failed(r) for t in g]
    total = sum(int(r) for r in res if not isinstance(r, Exception))
    if again:
        await _again(b)
        mine = set(again)
        per_tag = _split([(k, s, x, [y for y in ks if y[1] in mine]) for k, s, x, ks in parts],
                         {t: i for i, t in enumerate(again)}, len(again))
        total += sum(int(r) for r in await b.wave([
            (SLOT_OF_BYTE[t], NODE_WRITE.call(a[3][:width], head + a))
            for t, a in zip(again, per_tag, strict=True)]))
    return total


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
    width = len(hashes[0])
    raw = np.frombuffer(b"".join(hashes), np.uint8).reshape(-1, width)
    tag = raw[:, 0] % keys.N_TAGS
    order = np.argsort(tag, kind="stable")
    ranked = tag[order]
    starts = (np.flatnonzero(np.diff(ranked)) + 1).tolist()
    bounds = [0, *starts, len(hashes)]
    slots = [SLOT_OF_BYTE[keys.TAGS[t]] for t in ranked[bounds[:-1]].tolist()]
    cmds = resp.mget_runs(raw[order], bounds, ns.encode() if ns else None)
    res = await b.wave([*head, *zip(slots, cmds, strict=True)], retry=True)
    n, inv = len(head), np.argsort(order).tolist()
    got = res[n:]
    if not ns:
        return res[:n], _scatter(inv, got), None
    halves = [len(r) // 2 for r in got]
    return (res[:n], _scatter(inv, [r[:m] for r, m in zip(got, halves, strict=True)]),
            _scatter(inv, [r[m:] for r, m in zip(got, halves, strict=True)]))


async def provisional(b: ClusterBackend, pks: list[bytes], head: list[bytes],
                      extra: list[tuple[int, bytes]]) -> None:
    """Set or renew provisional keys ``pks`` (``cluster_prov_keys`` with ARGV ``head``
    then each node's keys concatenated) and run ``extra`` in the same round trip. The
    script sets one key at a time (idempotent): a node call that failed part way is sent
    again one tag at a time."""
    per_tag: dict[int, list[bytes]] = {}
    for pk in pks:
        per_tag.setdefault(pk[2], []).append(pk)
    groups = await by_node(b, list(per_tag))
    calls = [(SLOT_OF_BYTE[g[0]], PROV_KEYS.call(
        per_tag[g[0]][0], [*head, b"".join(chain.from_iterable(per_tag[t] for t in g))]))
        for g in groups]
    res = await b.wave_replies([*calls, *extra])
    for i, r in enumerate(res):
        if isinstance(r, Exception) and (i >= len(calls) or not _failed(r)):
            raise r
    again = [t for g, r in zip(groups, res[:len(calls)], strict=True) if _failed(r) for t in g]
    if again:
        await _again(b)
        await b.wave([(SLOT_OF_BYTE[t], PROV_KEYS.call(per_tag[t][0], [
            *head, b"".join(per_tag[t])])) for t in again])
