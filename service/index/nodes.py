"""Hand-packed commands sent straight to the primaries of a Redis Cluster, one write per
node, every node in parallel (all written, then each read in turn): the cluster backend's
one round trip.

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


async def _send(node: ClusterNode, cmds: list[bytes]) -> Connection:
    """A connection of ``node`` with ``cmds`` written to it (dropped on failure). Written
    straight to the stream, under one deadline: redis-py's ``send_packed_command`` runs
    each write in a task of its own (``asyncio.wait_for``), which cost more than the write
    and, on Python 3.11, can swallow a cancellation."""
    conn = node.acquire_connection()
    try:
        writer = getattr(conn, "_writer", None)
        if writer is None or not conn.is_connected:
            await conn.send_packed_command(cmds, check_health=False)
            return conn
        writer.writelines(cmds)
        try:
            async with asyncio.timeout(conn.socket_timeout):
                await writer.drain()  # returns at once unless the buffer is full
        except TimeoutError:  # asyncio's: the deadline above
            raise rexc.TimeoutError(f"Timeout writing to {conn.host}:{conn.port}") from None
        except OSError as e:
            raise rexc.ConnectionError(f"Error writing to {conn.host}:{conn.port}: {e}") from e
    except BaseException as e:
        await _drop(node, conn, e)
        raise
    return conn


async def _recv(node: ClusterNode, conn: Connection, n: int) -> list[Any]:
    """The ``n`` replies on ``conn``, then the connection back to ``node``'s pool."""
    try:
        out = await _read(conn, n)
    except BaseException as e:
        await _drop(node, conn, e)
        raise
    node.release(conn)
    return out


async def _node(node: ClusterNode, cmds: list[bytes]) -> list[Any]:
    return await _recv(node, await _send(node, cmds), len(cmds))


async def on_nodes(batch: Sequence[tuple[ClusterNode, bytes]], retry: bool = False) -> list[Any]:
    """Raw replies of ``batch`` (see the module contract), one write per node: every node's
    commands are written first, then each node's replies read in turn (no task per node:
    they cost more than the reads; the nodes still work in parallel, and each read has its
    own deadline). A node that failed with a network error is sent its commands once more
    with ``retry``."""
    per: dict[ClusterNode, list[int]] = {}
    for i, (node, _) in enumerate(batch):
        per.setdefault(node, []).append(i)
    nodes = list(per)
    cmds = [[batch[i][1] for i in per[n]] for n in nodes]
    conns: list[Connection | BaseException | None] = []  # None: read (or handed back)
    out: list[Any] = [None] * len(batch)
    failed: BaseException | None = None
    try:
        for n, c in zip(nodes, cmds, strict=True):
            try:
                conns.append(await _send(n, c))
            except Exception as e:  # the others are still read (never pooled unread)
                conns.append(e)
        for k, (n, c) in enumerate(zip(nodes, cmds, strict=True)):
            conn, conns[k] = conns[k], None
            try:
                if isinstance(conn, BaseException):
                    raise conn
                assert conn is not None
                res = await _recv(n, conn, len(c))
            except Exception as e:
                if not retry or not isinstance(e, _NET):
                    failed = failed or e
                    continue
                try:
                    res = await _node(n, c)
                except Exception as e2:
                    failed = failed or e2
                    continue
            for i, r in zip(per[n], res, strict=True):
                out[i] = r
    finally:  # cancelled midway: the connections not read yet are closed, not pooled
        for n, conn in zip(nodes, conns, strict=False):  # short if cancelled while sending
            if conn is not None and not isinstance(conn, BaseException):
                await _drop(n, conn, asyncio.CancelledError())
    if failed is not None:
        raise failed
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
