"""Warn about secret files (TLS private keys, tenant-key files) other users can read.

A key file readable by its group or by everyone leaks the credential to every local account
that can reach it, like ssh refusing a private key in mode 0644. kvmesh warns (it does not
refuse: containers and secret mounts often show group bits the operator cannot change) and
goes on.
"""
from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("kvmesh.file_perms")


def warn_if_readable_by_others(path: str | Path, what: str) -> bool:
    """Log a warning naming ``what`` (e.g. ``"--tls-key"``) when ``path`` grants its group or
    others any permission (``mode & 0o077``); returns whether it warned. A file that cannot
    be stat'ed is left to the caller's read to report."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return False
    if not mode & 0o077:
        return False
    log.warning("%s %r is readable by other users (mode %o): it holds a secret; "
                "chmod 600 it", what, str(path), mode)
    return True
