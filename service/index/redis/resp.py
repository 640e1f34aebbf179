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


def arg(x: Any) -> bytes:
    """A command argument as RESP sends it: bytes as they are, anything else its ``str``."""
    return x if isinstance(x, bytes) else str(x).encode()


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


def _fill(out: np.ndarray, at: int, raw: np.ndarray, prefixes: np.ndarray, head: bytes,
          tail: bytes) -> int:
    """Write each row's key ``head + {tag} + hash + tail`` into ``out`` from column ``at``;
    the column after it."""
    w = raw.shape[1]
    out[:, at:at + len(head)] = np.frombuffer(head, np.uint8)
    at += len(head)
    out[:, at:at + 3] = prefixes
    out[:, at + 3:at + 3 + w] = raw
    out[:, at + 3 + w:at + 3 + w + len(tail)] = np.frombuffer(tail, np.uint8)
    return at + 3 + w + len(tail)


def key_rows(raw: np.ndarray, head: bytes, tail: bytes) -> np.ndarray:
    """Per row of ``raw`` (hashes, one per row): the key ``head + {tag} + hash + tail``
    (``keys.block_key``, ``keys.prov_key``), as a row of bytes."""
    out = np.empty((len(raw), len(head) + 3 + raw.shape[1] + len(tail)), np.uint8)
    _fill(out, 0, raw, _PREFIXES[raw[:, 0]], head, tail)
    return out


def mget_runs(raw: np.ndarray, bounds: Sequence[int], tail: bytes | None = None) -> list[bytes]:
    """One ``MGET`` per run ``raw[bounds[i]:bounds[i + 1]]`` (hashes as rows, runs of one
    tag each) of the runs' block keys and, with ``tail``, each followed by its provisional
    key ``b"p" + block_key(h) + tail``: a cluster lookup reads both with one command per
    tag (they share its slot; the reply alternates). Built for all runs at once, one row
    of bytes per hash: a loop per hash cost more than the round trip."""
    w = raw.shape[1]
    kinds = [(b"", b"")] + ([(b"p", tail)] if tail is not None else [])
    leads = [b"$%d\r\n" % (len(h) + 3 + w + len(t)) for h, t in kinds]
    width = sum(len(lead) + len(h) + 3 + w + len(t) + 2 for lead, (h, t) in zip(
        leads, kinds, strict=True))
    rows = np.empty((len(raw), width), np.uint8)
    prefixes, at = _PREFIXES[raw[:, 0]], 0
    for lead, (h, t) in zip(leads, kinds, strict=True):
        at = _fill(rows, at, raw, prefixes, lead + h, t)
        rows[:, at:at + 2] = (13, 10)
        at += 2
    flat, per = rows.tobytes(), len(kinds)
    return [b"*%d\r\n$4\r\nMGET\r\n" % (per * (z - a) + 1) + flat[a * width:z * width]
            for a, z in zip(bounds[:-1], bounds[1:], strict=True)]


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
