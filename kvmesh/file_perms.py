"""Warn about secret files (TLS private keys, tenant-key files) that other users can reach.

A key file open to its group or to everyone leaks the credential to every local account
that can read it, as ssh says of a private key in mode 0644. kvmesh warns but does not
refuse (containers and secret mounts often show group bits the operator cannot change),
once per load, on the ``kvmesh.file_perms`` logger (which reaches stderr even before logging
is configured, through Python's last-resort handler). Windows has no POSIX mode bits: nothing
is reported there.
"""
from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("kvmesh.file_perms")


def warn_if_readable_by_others(path: str | Path, what: str) -> bool:
    """Log a warning naming ``what`` (``"--tls-key"``, ``"--tenant-keys file"``) when ``path``
    grants its group or others any permission (``mode & 0o077``); return whether it warned.
    A file that cannot be stat'ed is left to the caller's read to report."""
    if os.name == "nt":
        return False
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return False
    if not mode & 0o077:
        return False
    who = "everyone" if mode & 0o007 else "its group"
    log.warning("%s %r is readable by other users (readable by %s, mode %04o): it holds a "
                "secret; chmod 600 it", what, str(path), who, mode)
    return True
