"""Shared-memory segments of the shm plane: one /dev/shm file per pull, owner-only (0600).

The source sizes a fresh segment for the frames one pull has in flight (a ring: see
:mod:`kvmesh.transfer.zmq_serve`), writes each frame into its slot (``pwritev`` straight
from the offered buffers) and tells the receiver its path over the control socket;
the receiver opens it, checks it is a regular file of its own user that nobody else may read
and at least the size announced, unlinks it at once (a receiver's crash leaves nothing behind)
and maps it read-only: each frame reaches the sink as a view of the mapping, one copy in all
(the sink's). Only the source still holds the file then, and it never shortens it (a
shortened mapped file would SIGBUS the receiver; another process of the same user could do
that, but such a process can already read the worker's memory). The source unlinks it too
when its side ends. KV reveals prompts: the file is created 0600 with O_EXCL|O_NOFOLLOW, and
the receiver opens only names this module makes, inside :data:`SHM_DIR`, so a hostile
source cannot make it read or unlink anything else.

See docs/architecture.md#peer-kv-transfer-the-data-plane.
"""
from __future__ import annotations

import mmap
import os
import re
import secrets
import stat
from collections.abc import Sequence

from kvmesh.transfer.frames import TransferError

SHM_DIR = "/dev/shm"
PREFIX = "kvmesh-kv-"
_NAME = re.compile(r"^kvmesh-kv-\d+-[0-9a-f]{32}$")
_IOV_MAX = 1024


def create(size: int) -> tuple[str, int]:
    """A new segment of ``size`` bytes (not yet written, so no memory spent): ``(path,
    fd)``, mode 0600, opened for writing."""
    path = os.path.join(SHM_DIR, f"{PREFIX}{os.getpid()}-{secrets.token_hex(16)}")
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask can only narrow 0600; say it anyway
        os.ftruncate(fd, size)
    except OSError:
        os.close(fd)
        unlink(path)
        raise
    return path, fd


def write(fd: int, blocks: Sequence[memoryview], offset: int) -> None:
    """Write ``blocks`` back to back at ``offset`` (no intermediate copy)."""
    for i in range(0, len(blocks), _IOV_MAX):
        chunk = blocks[i:i + _IOV_MAX]
        want = sum(len(b) for b in chunk)
        done = os.pwritev(fd, chunk, offset)
        if done != want:  # tmpfs writes whole or fails; a short one means /dev/shm is full
            raise OSError(f"short write to the shm segment: {done} of {want} bytes")
        offset += want


def unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def open_for_read(path: str, size: int, landed: int = 0) -> mmap.mmap:
    """Map the segment at ``path`` (``size`` bytes) read-only and unlink it; TransferError
    "malformed" for a name this module would not make, "unreachable" if it is not there
    (another host), "refused" if it is not a regular file of this user, readable by this
    user alone, "truncated" if it is shorter than ``size``."""
    if os.path.dirname(path) != SHM_DIR or not _NAME.match(os.path.basename(path)):
        raise TransferError("malformed", landed, f"not a kvmesh shm segment: {path!r}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise TransferError("unreachable", landed, f"cannot open the shm segment {path}: {e} "
                            "(shm needs source and receiver on one host, one user)") from None
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid()
                or st.st_mode & 0o077):
            raise TransferError("refused", landed, f"the shm segment {path} is not a private "
                                "file of this user (mode 0600)")
        if st.st_size < size or size < 1:
            raise TransferError("truncated", landed, f"the shm segment holds {st.st_size} of "
                                f"{size} bytes")
        unlink(path)
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)  # the mapping keeps the pages
