"""A warning for secret files (private keys, API-key lists) that others may read.

Secrets belong in files only their owner can read (mode 0600 or 0400). A file that the
group or everyone may read is still used, since refusing it would break working setups,
but every process that loads one says so once, on the ``kvmesh.file_perms`` logger (which
reaches stderr even before logging is configured, through Python's last-resort handler).
Windows has no POSIX mode bits to check; nothing is reported there.
"""
from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("kvmesh.file_perms")


def warn_if_readable_by_others(path: str | os.PathLike[str], what: str) -> str | None:
    """Log and return a warning when ``path`` is readable by its group or by everyone.

    ``what`` names the file for the reader (``"--tenant-keys"``, ``"TLS private key"``).
    Returns ``None`` when the file is private, missing, or the platform has no mode bits
    (a missing file is the caller's error to report, not this function's).
    """
    if os.name == "nt":
        return None
    try:
        mode = Path(path).stat().st_mode
    except OSError:
        return None
    if not mode & (stat.S_IRGRP | stat.S_IROTH):
        return None
    who = "everyone" if mode & stat.S_IROTH else "its group"
    message = (f"{what} {os.fspath(path)} is readable by {who} (mode "
               f"{stat.S_IMODE(mode):04o}); it holds secrets: chmod 600 it")
    log.warning("%s", message)
    return message
