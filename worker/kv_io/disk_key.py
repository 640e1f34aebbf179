"""The disk tier's MAC key: a secret only this worker holds, kept across restarts.

``KVMESH_DISK_KEY`` (environment only) when set, else ``<disk dir>/disk.key`` (random,
0600, created race-free). A key file that is not a regular private file of the right size
owned by this user stops the start: it may have leaked.

See docs/architecture.md#worker-data-plane.
"""
from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from kvmesh.ops.file_perms import UnsafePath, create_private_file, open_to_others

KEY_ENV = "KVMESH_DISK_KEY"
KEY_FILE = "disk.key"
KEY_BYTES = 32
MIN_ENV_KEY = 32
_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(
    os, "O_CLOEXEC", 0)


def disk_key(root: str | Path) -> bytes:
    """The MAC key for the disk tier under ``root`` (an already private directory): the
    environment's, else ``root``'s key file, created if missing. Raises :class:`UnsafePath`
    (a ``ValueError``) for a key that is too short or a key file others can reach."""
    env = os.environ.get(KEY_ENV)
    if env is not None:
        key = env.encode()
        if len(key) < MIN_ENV_KEY:
            raise UnsafePath(f"{KEY_ENV} is {len(key)} bytes long: give at least "
                             f"{MIN_ENV_KEY} (e.g. openssl rand -hex 32)")
        return key
    path = Path(root) / KEY_FILE
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    create_private_file(tmp, secrets.token_bytes(KEY_BYTES))
    try:
        os.link(tmp, path)  # atomic, and refuses to replace: one key wins a race
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    try:
        fd = os.open(path, _READ)
    except OSError as e:
        if e.errno == errno.ELOOP:  # O_NOFOLLOW: never read a key through a symlink
            raise UnsafePath(f"disk tier key {str(path)!r} is a symlink: refusing it") from e
        raise
    try:
        if open_to_others(fd, path, "disk tier key"):
            mode = stat.S_IMODE(os.fstat(fd).st_mode)
            raise UnsafePath(f"disk tier key {str(path)!r} is open to other users (mode "
                             f"{mode:04o}): it may have leaked; delete it (the disk blocks "
                             f"are then recomputed)")
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise UnsafePath(f"disk tier key {str(path)!r} holds {len(key)} bytes, not "
                         f"{KEY_BYTES}: delete it (the disk blocks are then recomputed)")
    return key
