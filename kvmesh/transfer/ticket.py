"""Fetch tickets: the service's grant that lets one worker read named blocks from another.

Fetching KV reveals prompts, so a source serves only what the service authorised, to the
requester it authorised, until the ticket expires. Each worker has a peer key,
:func:`peer_key` of the credential it presents to the service (so the service, which can
mint every worker's credential, and that worker alone know it). The service mints::

    body  = requester id, source id, expiry (unix ms), nonce, SHA-256 of the block hashes
    proof = HMAC(peer_key(requester), body)
    tag   = HMAC(peer_key(source), body || SHA-256(proof))
    ticket = body || tag

The ticket travels through the router and the client (who see it but hold neither key);
the requester recomputes ``proof`` with its own key and sends it with the ticket; the source
checks ``tag`` with its own key. A router, or any other worker, holding the ticket cannot
compute the proof; nobody but the service can bind other hashes, another source or a later
expiry. With one shared worker token (no per-worker credentials) every worker has the same
key: tickets then stop outsiders, not a hostile worker.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass

_KEY_LABEL = b"kvmesh peer key v1\x00"
_VERSION = 1
_HEAD = struct.Struct("<BHHq16s32s")  # version, len(requester), len(source), expiry, nonce, digest
TAG_BYTES = 32
MAX_ID_BYTES = 1024
DEFAULT_TTL_S = 30.0


class TicketError(ValueError):
    """A ticket that does not grant this fetch; ``reason`` names why (a metric label)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Grant:
    """What a verified ticket allows."""

    requester: str
    source: str
    expiry_ms: int
    hashes_digest: bytes


def peer_key(credential: str | None) -> bytes:
    """The peer key of a worker presenting ``credential`` to the service ("" or ``None``: a
    cluster without worker credentials, where anyone can mint tickets)."""
    return hmac.new((credential or "").encode(), _KEY_LABEL, hashlib.sha256).digest()


def hashes_digest(block_hashes: Sequence[bytes]) -> bytes:
    """SHA-256 over the length-prefixed hashes, in order (no two lists share bytes)."""
    h = hashlib.sha256()
    for b in block_hashes:
        h.update(len(b).to_bytes(2, "little"))
        h.update(b)
    return h.digest()


def _body(requester: str, source: str, expiry_ms: int, nonce: bytes, digest: bytes) -> bytes:
    r, s = requester.encode(), source.encode()
    if not r or not s or len(r) > MAX_ID_BYTES or len(s) > MAX_ID_BYTES:
        raise ValueError("requester and source ids must be 1..1024 bytes")
    return _HEAD.pack(_VERSION, len(r), len(s), expiry_ms, nonce, digest) + r + s


def proof(requester_key: bytes, ticket: bytes) -> bytes:
    """What the requester sends beside ``ticket``: HMAC of its body under its own key."""
    return hmac.new(requester_key, ticket[:-TAG_BYTES], hashlib.sha256).digest()


def mint(source_key: bytes, requester_key: bytes, requester: str, source: str,
         block_hashes: Sequence[bytes], now_ms: int, ttl_s: float = DEFAULT_TTL_S) -> bytes:
    """A ticket letting ``requester`` fetch ``block_hashes`` from ``source`` until
    ``now_ms + ttl_s``."""
    body = _body(requester, source, now_ms + int(ttl_s * 1000), os.urandom(16),
                 hashes_digest(block_hashes))
    p = hmac.new(requester_key, body, hashlib.sha256).digest()
    tag = hmac.new(source_key, body + hashlib.sha256(p).digest(), hashlib.sha256).digest()
    return body + tag


def parse(ticket: bytes) -> Grant:
    """The fields of ``ticket``, unverified. Raises :class:`TicketError` ("malformed")."""
    if len(ticket) < _HEAD.size + TAG_BYTES:
        raise TicketError("malformed", "the fetch ticket is truncated")
    version, nr, ns, expiry, _nonce, digest = _HEAD.unpack_from(ticket)
    if version != _VERSION or len(ticket) != _HEAD.size + nr + ns + TAG_BYTES:
        raise TicketError("malformed", "the fetch ticket is malformed")
    ids = ticket[_HEAD.size:_HEAD.size + nr + ns]
    try:
        return Grant(ids[:nr].decode(), ids[nr:].decode(), expiry, digest)
    except UnicodeDecodeError:
        raise TicketError("malformed", "the fetch ticket is malformed") from None


def verify(source_key: bytes, ticket: bytes, proof_bytes: bytes, *, source: str,
           requester: str, block_hashes: Sequence[bytes], now_ms: int) -> Grant:
    """The grant of ``ticket`` if it lets ``requester`` (proved by ``proof_bytes``) fetch
    ``block_hashes`` from ``source`` (this worker) at ``now_ms``; else :class:`TicketError`
    with reason "malformed", "forged" (tag or proof wrong), "not_for_me" (another source or
    requester), "hashes" (other blocks) or "expired"."""
    grant = parse(ticket)
    body, tag = ticket[:-TAG_BYTES], ticket[-TAG_BYTES:]
    want = hmac.new(source_key, body + hashlib.sha256(proof_bytes).digest(),
                    hashlib.sha256).digest()
    if not hmac.compare_digest(tag, want):
        raise TicketError("forged", "the fetch ticket or its proof does not verify: only the "
                          "metadata service mints tickets, for the worker that fetches")
    if grant.source != source or grant.requester != requester:
        raise TicketError("not_for_me", f"the fetch ticket grants {grant.requester!r} a "
                          f"fetch from {grant.source!r}, not {requester!r} from {source!r}")
    if not hmac.compare_digest(grant.hashes_digest, hashes_digest(block_hashes)):
        raise TicketError("hashes", "the fetch asks for blocks its ticket does not grant")
    if now_ms > grant.expiry_ms:
        raise TicketError("expired", f"the fetch ticket expired {now_ms - grant.expiry_ms} "
                          "ms ago: route again")
    return grant
