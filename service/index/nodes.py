"""Hand-packed commands sent straight to the primaries of a Redis Cluster, one write per
node, every node in parallel: the cluster backend's one round trip.

Replies come back in the order given (an error reply as its ``ResponseError``; with hiredis
they are parsed straight from its reader's buffer, a few microseconds less per reply than
redis-py's reply path, which a lookup pays once per tag); ``MOVED``
refreshes the slot map and resends once. Reads may retry a failed node once; writes never
(a script whose reply was lost would run twice). A connection that failed midway is closed,
never pooled with unread replies.

See docs/architecture.md#redis-cluster-details.
"""
from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import hiredis
import redis.exceptions as rexc
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import Connection

__all__ = ["on_nodes", "on_slots", "primary"]

_NET = (rexc.ConnectionError, rexc.TimeoutError, OSError)


async def primary(client: RedisCluster, slot: int) -> ClusterNode:
    """The primary serving ``slot`` (``SlotNotCoveredError`` when none does)."""
    await client.initialize()  # a no-op once the slot map is known
    return client.nodes_manager.get_node_from_slot(slot)


async def _read(conn: Connection, n: int) -> list[Any]:
    """The ``n`` replies of what was sent on ``conn``, under one deadline: redis-py's own
    per-reply timeout costs more than reading a reply (a lookup reads one per tag)."""
    parser = conn._parser
    reader = getattr(parser, "_reader", None)
    fast = isinstance(reader, hiredis.Reader) and hasattr(parser, "read_from_socket")
    # the reader's "not enough data" marker: nothing is fed to it before the replies
    more = reader.gets(False) if fast else None
    out: list[Any] = []
    try:
        async with asyncio.timeout(conn.socket_timeout):
            if fast:  # hiredis parses every reply in the buffer; read the socket when dry
                while len(out) < n:
                    r = reader.gets(False)
                    if r is more:
                        await parser.read_from_socket()
                    elif isinstance(r, (rexc.ConnectionError, rexc.InvalidResponse)):
                        raise r
                    else:
                        out.append(r)  # an error reply is its exception (parse_error)
                return out
            for _ in range(n):
                try:
                    out.append(await conn.read_response(disable_decoding=True,
                                                        timeout=math.inf))
                except rexc.ResponseError as e:
                    out.append(e)
    except TimeoutError:  # asyncio's: the deadline above
        raise rexc.TimeoutError(f"Timeout reading from {conn.host}:{conn.port}") from None
    return out


async def _drop(node: ClusterNode, conn: Connection, e: BaseException) -> None:
    """A connection that failed midway: closed, never pooled with unread replies; on a
    network error the node's idle connections too (the node may have restarted)."""
    await conn.disconnect()
    node.release(conn)
    if isinstance(e, _NET):
        drop = getattr(node, "disconnect_free_connections", None)  # redis-py >= 6
        if drop is not None:
            await drop()


async def _node(node: ClusterNode, cmds: list[bytes], retry: bool) -> list[Any]:
    for attempt in (0, 1):
        conn = node.acquire_connection()
        try:
            await conn.send_packed_command(cmds, check_health=False)
            out = await _read(conn, len(cmds))
        except BaseException as e:
            await _drop(node, conn, e)
            if attempt or not retry or not isinstance(e, _NET):
                raise
            continue
        node.release(conn)
        return out
    raise AssertionError("unreachable")


async def on_nodes(batch: Sequence[tuple[ClusterNode, bytes]], retry: bool = False) -> list[Any]:
    """Raw replies of ``batch`` (see the module contract), one write per node."""
    per: dict[ClusterNode, list[int]] = {}
    for i, (node, _) in enumerate(batch):
        per.setdefault(node, []).append(i)
    nodes = list(per)
    done = await asyncio.gather(
        *(_node(n, [batch[i][1] for i in per[n]], retry) for n in nodes),
        return_exceptions=True)
    out: list[Any] = [None] * len(batch)
    for n, res in zip(nodes, done, strict=True):
        if isinstance(res, BaseException):
            raise res
        for i, r in zip(per[n], res, strict=True):
            out[i] = r
    return out


async def on_slots(client: RedisCluster, batch: Sequence[tuple[int, bytes]],
                   retry: bool = False) -> list[Any]:
    """Raw replies of ``batch``, each command on its slot's primary (module contract)."""
    await client.initialize()
    nm = client.nodes_manager
    out = await on_nodes([(nm.get_node_from_slot(s), c) for s, c in batch], retry)
    moved = [i for i, r in enumerate(out) if isinstance(r, rexc.MovedError)]
    if moved:
        await nm.initialize()  # the slot map changed: read it again, send those again
        again = await on_nodes([(nm.get_node_from_slot(batch[i][0]), batch[i][1])
                                for i in moved], retry)
        for i, r in zip(moved, again, strict=True):
            out[i] = r
    return out
