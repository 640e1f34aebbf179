"""Commands packed by hand for the lookup's hot path, sent as one MULTI/EXEC transaction.

Why: a lookup reads every block key of the prompt with one ``MGET`` (512 keys for an
8K-token prompt). redis-py packs each argument in Python (about 0.4 µs each); here a key's
whole RESP element, but for the hash itself, is precomputed per first byte of the hash
(the byte that picks its tag), so packing costs one list append per block.

Contract: :func:`command` and :func:`mget` return RESP arrays of bulk strings (byte-exact
what any client would send); :func:`transact` sends ``MULTI``, the commands and ``EXEC`` on
one connection of ``client``'s pool in one write and returns EXEC's reply with raw
(undecoded) bytes: one atomic snapshot (only reads go through it, so a retry is safe). A
connection that fails or is cancelled midway is closed, never returned to the pool with
unread replies.
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np
import redis.asyncio as aioredis
import redis.exceptions as rexc

from service.index.redis.keys import PREFIX_BY_BYTE

_MULTI = b"*1\r\n$5\r\nMULTI\r\n"
_EXEC = b"*1\r\n$4\r\nEXEC\r\n"


def command(*args: bytes) -> bytes:
    """One command as a RESP array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        out += (b"$%d\r\n" % len(a), a, b"\r\n")
    return b"".join(out)


@cache
def _leads(size: int, head: bytes) -> tuple[bytes, ...]:
    """Per first byte of a hash: what precedes the hash in its MGET element (the end of
    the previous element, the bulk length, ``head`` and the key's tag)."""
    return tuple(b"\r\n$%d\r\n" % size + head + p for p in PREFIX_BY_BYTE)


def mget(hashes: Sequence[bytes], head: bytes = b"", tail: bytes = b"") -> bytes:
    """``MGET`` of ``head + block_key(h) + tail`` for every h of ``hashes`` (one width)."""
    leads = _leads(len(head) + 3 + len(hashes[0]) + len(tail), head)
    out = [b"*%d\r\n$4\r\nMGET" % (len(hashes) + 1)]
    if tail:
        for h in hashes:
            out += (leads[h[0]], h, tail)
    else:
        for h in hashes:
            out += (leads[h[0]], h)
    out.append(b"\r\n")
    return b"".join(out)


_PREFIXES = np.frombuffer(b"".join(PREFIX_BY_BYTE), np.uint8).reshape(256, 3)


def _elements(raw: np.ndarray, head: bytes, tail: bytes) -> np.ndarray:
    """Per row of ``raw`` (hashes, one per row): the RESP bulk string of the key ``head +
    {tag} + hash + tail``, as a row of bytes."""
    n, w = raw.shape
    lead = b"$%d\r\n" % (len(head) + 3 + w + len(tail)) + head
    el = np.empty((n, len(lead) + 3 + w + len(tail) + 2), np.uint8)
    el[:, :len(lead)] = np.frombuffer(lead, np.uint8)
    el[:, len(lead):len(lead) + 3] = _PREFIXES[raw[:, 0]]
    el[:, len(lead) + 3:len(lead) + 3 + w] = raw
    if tail:
        el[:, len(lead) + 3 + w:-2] = np.frombuffer(tail, np.uint8)
    el[:, -2:] = (13, 10)
    return el


def mget_runs(raw: np.ndarray, bounds: Sequence[int], tail: bytes | None = None) -> list[bytes]:
    """One ``MGET`` per run ``raw[bounds[i]:bounds[i + 1]]`` (hashes as rows, runs of one
    tag each) of the runs' block keys and, with ``tail``, then of their provisional keys
    ``b"p" + block_key(h) + tail``: a cluster lookup reads both with one command per tag
    (they share its slot). Built for all runs at once: a loop per hash cost more than
    the round trip."""
    el = _elements(raw, b"", b"").tobytes()
    pel = _elements(raw, b"p", tail).tobytes() if tail is not None else b""
    ew = len(el) // len(raw)
    pw = len(pel) // len(raw)
    per = 2 if tail is not None else 1
    out = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        out.append(b"*%d\r\n$4\r\nMGET\r\n" % (per * (b - a) + 1) + el[a * ew:b * ew]
                   + pel[a * pw:b * pw])
    return out


async def transact(client: aioredis.Redis, commands: Sequence[bytes]) -> list[Any]:
    """EXEC's reply to ``MULTI; commands; EXEC`` (see the module contract). A connection
    error or timeout is retried once on a fresh connection, as the client's own commands
    are (a pooled connection may have outlived a restarted server)."""
    try:
        return await _transact(client, commands)
    except (rexc.ConnectionError, rexc.TimeoutError, OSError):
        return await _transact(client, commands)


async def _transact(client: aioredis.Redis, commands: Sequence[bytes]) -> list[Any]:
    pool = client.connection_pool
    conn = await pool.get_connection()
    try:
        await conn.send_packed_command([_MULTI, *commands, _EXEC], check_health=False)
        for _ in range(len(commands) + 1):  # +OK, then QUEUED for each command
            await conn.read_response(disable_decoding=True)
        res = await conn.read_response(disable_decoding=True)
    except BaseException:
        await conn.disconnect()
        raise
    finally:
        await pool.release(conn)
    if not isinstance(res, list) or len(res) != len(commands):
        raise rexc.ResponseError(f"unexpected reply to a transaction: {res!r:.200}")
    return res
