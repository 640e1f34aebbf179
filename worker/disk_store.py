"""The disk tier's files: one file per KV block, written atomically, verified on every read.

Layout. Files live in ``<disk_dir>/<fingerprint[:16] hex>/<block hash hex>.kvb``: the
subdirectory is the model fingerprint (:func:`model_fingerprint`: shapes, dtype, block
size, a sample of the weights, hash algorithm and root hash), so a worker started with
another model or hash seed on the same ``disk_dir`` never even lists the other's files.

One file::

    MAGIC (8 bytes) | header length H (u32 LE) | header (CBOR, H bytes)
    | xxh3_64(MAGIC..header) (8 bytes, LE) | payload (header["nbytes"] bytes)

The header is a CBOR map: ``v`` (format version), ``fp`` (the full fingerprint), ``hash``,
``parent`` (None for a chain's first block), ``tokens``, ``extra`` (the block's extra keys,
tuples as arrays), ``nbytes`` and ``xxh`` (xxh3_128 of the payload). The header has its own
checksum so :meth:`DiskStore.scan` can trust the tokens and hashes it announces without
reading every payload; the payload's checksum is checked by :meth:`DiskStore.read`.

Contracts:

- :meth:`DiskStore.write` is atomic (a temporary file in the same directory, then
  ``os.replace``): a reader sees the old file, the new file or none, never a part of one.
- :meth:`DiskStore.read` returns a payload only when every check passes (magic, version,
  fingerprint, header checksum, the requested hash, exact file size, payload checksum).
  Otherwise it deletes the file and raises :class:`CorruptBlock`: a damaged block is
  recomputed, never used.
- :meth:`DiskStore.scan` returns the entries of every valid-looking file, oldest first, and
  deletes leftover temporary files and files whose header or size is wrong.

Not thread-safe per hash: the engine serialises all operations on one hash through the
copy executor's FIFO thread (a write, then reads, then the delete).
"""
from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import cbor2
import torch
import xxhash

log = logging.getLogger("kvmesh.worker.disk")

MAGIC = b"KVMBLK\x00\x01"
VERSION = 1
SUFFIX = ".kvb"
_LEN = struct.Struct("<I")
_SUM = struct.Struct("<Q")
_MAX_HEADER = 1 << 24  # a header longer than this is garbage, not a block


class CorruptBlock(Exception):
    """A disk block failed verification (or its file is gone); the file was deleted."""


class DiskEntry(NamedTuple):
    """What a block file says about its block: the tuple ``manager.restore_disk`` takes."""

    block_hash: bytes
    parent_hash: bytes | None
    token_ids: tuple[int, ...]
    extra_keys: tuple[tuple[Any, ...], ...] | None


def model_fingerprint(model: torch.nn.Module, config: Any, block_size: int,
                      dtype: torch.dtype, hash_algo: str, root_hash: bytes) -> bytes:
    """16 bytes naming everything a block's KV bytes depend on besides its tokens.

    Shapes, dtype and block size decide the layout; the hash algorithm and root hash (the
    seed) decide which hashes name which tokens; a small sample of the weights tells two
    checkpoints of the same shape apart (cheap: a few rows, whatever the model's size)."""
    h = xxhash.xxh3_128()
    h.update(repr((config.num_hidden_layers, config.num_key_value_heads, config.head_dim,
                   str(dtype), block_size, hash_algo)).encode())
    h.update(root_hash)
    for name, p in sorted(model.named_parameters()):
        if p.dim() >= 1:
            sample = p.detach().reshape(-1)[:64].to("cpu", torch.float32).contiguous()
            h.update(name.encode())
            h.update(sample.numpy().tobytes())
    return h.digest()


def _tuples(x: Any) -> Any:
    """CBOR arrays back to the tuples the hashing code compares with."""
    return tuple(_tuples(i) for i in x) if isinstance(x, list) else x


class DiskStore:
    """Block files of one model fingerprint under ``root`` (see the module docstring).

    ``block_nbytes``: the payload size of every block; a file announcing another size is
    invalid."""

    def __init__(self, root: str | Path, fingerprint: bytes, block_nbytes: int) -> None:
        self.fingerprint = fingerprint
        self.block_nbytes = block_nbytes
        self.dir = Path(root) / fingerprint.hex()[:16]
        self.dir.mkdir(parents=True, exist_ok=True)

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
            "xxh": xxhash.xxh3_128_digest(payload)})
        head = MAGIC + _LEN.pack(len(header)) + header
        head += _SUM.pack(xxhash.xxh3_64_intdigest(head))
        final = self.path(entry.block_hash)
        tmp = final.with_name(f"{final.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(head)
                f.write(payload)
            os.replace(tmp, final)
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
            raise ValueError("bad magic")
        (hlen,) = _LEN.unpack_from(fixed, len(MAGIC))
        if hlen > _MAX_HEADER:
            raise ValueError("header too long")
        rest = f.read(hlen + _SUM.size)
        if len(rest) < hlen + _SUM.size:
            raise ValueError("truncated header")
        header_bytes = rest[:hlen]
        (want,) = _SUM.unpack_from(rest, hlen)
        if xxhash.xxh3_64_intdigest(fixed + header_bytes) != want:
            raise ValueError("header checksum mismatch")
        header = cbor2.loads(header_bytes)
        if header.get("v") != VERSION or header.get("fp") != self.fingerprint:
            raise ValueError("another format version or model fingerprint")
        offset = len(fixed) + len(rest)
        if header.get("nbytes") != self.block_nbytes or size != offset + self.block_nbytes:
            raise ValueError(f"size {size} does not match the header (truncated?)")
        return header, offset

    def read(self, block_hash: bytes, out: memoryview | None = None) -> memoryview:
        """The verified payload of ``block_hash`` (into ``out`` when given, a writable
        buffer of ``block_nbytes`` bytes). Raises :class:`CorruptBlock` (and deletes the
        file) when the file is missing, damaged, truncated or names another block."""
        path = self.path(block_hash)
        try:
            with open(path, "rb") as f:
                header, _ = self._header(f, os.fstat(f.fileno()).st_size)
                if header.get("hash") != block_hash:
                    raise ValueError("the file holds another block")
                buf = memoryview(out if out is not None else bytearray(self.block_nbytes))
                buf = buf.cast("B")
                if f.readinto(buf) != self.block_nbytes:
                    raise ValueError("truncated payload")
                if xxhash.xxh3_128_digest(buf) != header.get("xxh"):
                    raise ValueError("payload checksum mismatch")
                return buf
        except FileNotFoundError as e:
            raise CorruptBlock(f"{path.name}: missing") from e
        except (ValueError, OSError, cbor2.CBORDecodeError) as e:
            log.warning("disk block %s is unusable (%s): deleted, it will be recomputed",
                        path.name, e)
            path.unlink(missing_ok=True)
            raise CorruptBlock(f"{path.name}: {e}") from e

    def scan(self) -> list[DiskEntry]:
        """Entries of the valid files, oldest first (the disk tier's LRU order at start).
        Deletes temporary leftovers and files with a bad header or size; payloads are
        checked later, on read."""
        found: list[tuple[float, DiskEntry]] = []
        for path in self.dir.iterdir():
            if path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)
                continue
            if not path.name.endswith(SUFFIX):
                continue
            try:
                with open(path, "rb") as f:
                    st = os.fstat(f.fileno())
                    header, _ = self._header(f, st.st_size)
                if path.name != header["hash"].hex() + SUFFIX:
                    raise ValueError("file name and header disagree")
                found.append((st.st_mtime, DiskEntry(
                    header["hash"], header["parent"], tuple(header["tokens"]),
                    _tuples(header["extra"]))))
            except (ValueError, OSError, KeyError, TypeError, AttributeError,
                    cbor2.CBORDecodeError) as e:
                log.warning("disk block %s is unusable (%s): deleted", path.name, e)
                path.unlink(missing_ok=True)
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
