"""The disk tier's files: one file per KV block, private, authenticated, written atomically.

Files live under a directory named by the model fingerprint (another model or seed never
sees them), 0700/0600, never through a symlink. Each carries a MAC'd CBOR header and a MAC'd
payload, so without the worker's key nobody can write a file that passes. ``write`` is atomic
(temporary file + ``os.replace``); ``read`` returns a payload only when every check passes,
else deletes the file and raises :class:`CorruptBlock`; ``scan`` keeps every verified file
and deletes the rest. Not thread-safe per hash: the copy executor's FIFO thread serialises.

See docs/architecture.md#worker-data-plane.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
import struct
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import cbor2

from kvmesh.ops.file_perms import create_private_file, private_dir
from worker.kv_io.disk_key import disk_key
from worker.model.fingerprint import model_fingerprint as model_fingerprint  # re-exported

log = logging.getLogger("kvmesh.worker.disk")

MAGIC = b"KVMBLK\x00\x02"
VERSION = 2  # 1: xxh3 checksums, no key
SUFFIX = ".kvb"
_LEN = struct.Struct("<I")
_TAG = hashlib.sha256().digest_size
_MAX_HEADER = 1 << 24  # a header longer than this is garbage, not a block
_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(
    os, "O_CLOEXEC", 0)


class CorruptBlock(Exception):
    """A disk block failed verification (or its file is gone); the file was deleted."""


class DiskEntry(NamedTuple):
    """What a block file says about its block: the tuple ``manager.restore_disk`` takes."""

    block_hash: bytes
    parent_hash: bytes | None
    token_ids: tuple[int, ...]
    extra_keys: tuple[tuple[Any, ...], ...] | None


_DIGEST_SIZES = (16, 32)  # the block-hash algorithms' digests (kvmesh.hashing)
_SCALARS = (str, int, bytes)


def check_entry(block_hash: Any, parent: Any, tokens: Any, extra: Any) -> DiskEntry:
    """The header's fields as a :class:`DiskEntry` when they have the shapes the hashing
    code takes (a digest, a digest or None, non-negative int token ids, None or arrays of
    scalars); ``ValueError`` otherwise. A header that verifies was written by this worker,
    but a bad field in one must cost that file, never the start (``restore_disk`` would
    raise on it)."""
    if not isinstance(block_hash, bytes) or len(block_hash) not in _DIGEST_SIZES:
        raise ValueError("the block hash is not a digest")
    if parent is not None and (not isinstance(parent, bytes) or len(parent) != len(block_hash)):
        raise ValueError("the parent hash is not a digest")
    if not isinstance(tokens, list) or not all(
            type(t) is int and 0 <= t < 1 << 63 for t in tokens):
        raise ValueError("the token ids are not non-negative integers")
    if extra is not None and not (isinstance(extra, list) and all(
            isinstance(k, list) and k and all(isinstance(v, _SCALARS) for v in k)
            for k in extra)):
        raise ValueError("the extra keys are not arrays of scalars")
    return DiskEntry(block_hash, parent, tuple(tokens), _tuples(extra))


def _tuples(x: Any) -> Any:
    """CBOR arrays back to the tuples the hashing code compares with."""
    return tuple(_tuples(i) for i in x) if isinstance(x, list) else x


class DiskStore:
    """Block files of one model fingerprint under ``root`` (see the module docstring).

    ``block_nbytes``: the payload size of every block; a file announcing another size is
    invalid. ``key``: the MAC secret; None takes ``worker.kv_io.disk_key.disk_key(root)``.
    Raises :class:`~kvmesh.ops.file_perms.UnsafePath` (a ``ValueError``) for a directory or key
    others control."""

    def __init__(self, root: str | Path, fingerprint: bytes, block_nbytes: int, *,
                 key: bytes | None = None) -> None:
        self.fingerprint = fingerprint
        self.block_nbytes = block_nbytes
        self.root = private_dir(root, "--disk-dir")
        secret = key if key is not None else disk_key(self.root)
        self.dir = private_dir(self.root / fingerprint.hex()[:16],
                               "the disk tier's fingerprint directory", follow=False)
        self._header_key = hmac.digest(secret, b"kvmesh disk header", "sha256")
        self._payload_key = hmac.digest(secret, b"kvmesh disk payload", "sha256")
        self._lock = threading.Lock()
        self.rejected = 0

    def path(self, block_hash: bytes) -> Path:
        return self.dir / (block_hash.hex() + SUFFIX)

    # --- write / delete -------------------------------------------------------------

    def write(self, entry: DiskEntry, payload: memoryview | bytes) -> None:
        """Write ``entry`` with its KV ``payload`` (``block_nbytes`` bytes) atomically."""
        payload = memoryview(payload).cast("B")
        if payload.nbytes != self.block_nbytes:
            raise ValueError(f"payload is {payload.nbytes} bytes, blocks are "
                             f"{self.block_nbytes}")
        header = cbor2.dumps({
            "v": VERSION, "fp": self.fingerprint, "hash": entry.block_hash,
            "parent": entry.parent_hash, "tokens": list(entry.token_ids),
            "extra": entry.extra_keys, "nbytes": payload.nbytes,
            "mac": hmac.digest(self._payload_key, payload, "sha256")})
        head = MAGIC + _LEN.pack(len(header)) + header
        head += hmac.digest(self._header_key, head, "sha256")
        final = self.path(entry.block_hash)
        tmp = final.with_name(f"{final.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            create_private_file(tmp, head, payload)
            os.replace(tmp, final)  # replaces a symlink planted at final, never follows it
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def delete(self, block_hash: bytes) -> None:
        self.path(block_hash).unlink(missing_ok=True)

    # --- read -----------------------------------------------------------------------

    def _header(self, f: Any, size: int) -> tuple[dict[str, Any], int]:
        """The verified header of an open file and the payload's offset; raises ValueError."""
        fixed = f.read(len(MAGIC) + _LEN.size)
        if len(fixed) < len(MAGIC) + _LEN.size or fixed[:len(MAGIC)] != MAGIC:
            raise ValueError("bad magic (another format version?)")
        (hlen,) = _LEN.unpack_from(fixed, len(MAGIC))
        if hlen > _MAX_HEADER:
            raise ValueError("header too long")
        rest = f.read(hlen + _TAG)
        if len(rest) < hlen + _TAG:
            raise ValueError("truncated header")
        header_bytes = rest[:hlen]
        want = hmac.digest(self._header_key, fixed + header_bytes, "sha256")
        if not hmac.compare_digest(want, rest[hlen:]):
            raise ValueError("header MAC mismatch (damaged, or not written by this worker)")
        header = cbor2.loads(header_bytes)
        if not isinstance(header, dict):
            raise ValueError("the header is not a map")
        if header.get("v") != VERSION or header.get("fp") != self.fingerprint:
            raise ValueError("another format version or model fingerprint")
        offset = len(fixed) + len(rest)
        if header.get("nbytes") != self.block_nbytes or size != offset + self.block_nbytes:
            raise ValueError(f"size {size} does not match the header (truncated?)")
        return header, offset

    def _open(self, path: Path) -> Any:
        """``path`` opened for reading, never through a symlink, only if a regular file
        (``O_NONBLOCK``: a FIFO planted there cannot hang the open)."""
        fd = os.open(path, _READ)
        f = os.fdopen(fd, "rb")
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            f.close()
            raise ValueError("not a regular file")
        return f

    def _reject(self, path: Path, why: object) -> None:
        """Delete an unusable file and count it; never raises (a bad file is skipped)."""
        log.warning("disk block %s is unusable (%s): deleted, it will be recomputed",
                    path.name, why)
        with self._lock:
            self.rejected += 1
        try:
            path.unlink(missing_ok=True)
        except OSError as e:  # a directory planted under the name, say: leave it, logged
            log.warning("could not delete %s: %s", path, e)

    def read(self, block_hash: bytes, out: memoryview | None = None) -> memoryview:
        """The verified payload of ``block_hash`` (into ``out`` when given, a writable
        buffer of ``block_nbytes`` bytes). Raises :class:`CorruptBlock` (and deletes the
        file) when the file is missing, damaged, truncated, forged or names another block."""
        path = self.path(block_hash)
        try:
            with self._open(path) as f:
                header, _ = self._header(f, os.fstat(f.fileno()).st_size)
                if header.get("hash") != block_hash:
                    raise ValueError("the file holds another block")
                buf = memoryview(out if out is not None else bytearray(self.block_nbytes))
                buf = buf.cast("B")
                if f.readinto(buf) != self.block_nbytes:
                    raise ValueError("truncated payload")
                mac = header.get("mac")
                if not isinstance(mac, bytes) or not hmac.compare_digest(
                        hmac.digest(self._payload_key, buf, "sha256"), mac):
                    raise ValueError("payload MAC mismatch")
                return buf
        except FileNotFoundError as e:
            raise CorruptBlock(f"{path.name}: missing") from e
        except Exception as e:  # noqa: BLE001 - whatever is wrong, this block is unusable
            self._reject(path, e)
            raise CorruptBlock(f"{path.name}: {e}") from e

    def scan(self) -> list[DiskEntry]:
        """Entries of the valid files, oldest first (the disk tier's LRU order at start).
        Deletes temporary leftovers and every file with a bad header, size or entry (each
        counted in ``rejected``); payloads are checked later, on read."""
        found: list[tuple[float, DiskEntry]] = []
        for path in self.dir.iterdir():
            if path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)
                continue
            if not path.name.endswith(SUFFIX):
                continue
            try:
                with self._open(path) as f:
                    st = os.fstat(f.fileno())
                    header, _ = self._header(f, st.st_size)
                entry = check_entry(header.get("hash"), header.get("parent"),
                                    header.get("tokens"), header.get("extra"))
                if path.name != entry.block_hash.hex() + SUFFIX:
                    raise ValueError("file name and header disagree")
                found.append((st.st_mtime, entry))
            except Exception as e:  # noqa: BLE001 - one bad file never stops the start
                self._reject(path, e)
        found.sort(key=lambda x: x[0])
        return [e for _, e in found]

    def keep_only(self, hashes: Iterable[bytes]) -> int:
        """Delete every block file whose hash is not in ``hashes``; return how many."""
        keep = {h.hex() + SUFFIX for h in hashes}
        gone = 0
        for path in self.dir.glob("*" + SUFFIX):
            if path.name not in keep:
                path.unlink(missing_ok=True)
                gone += 1
        return gone
