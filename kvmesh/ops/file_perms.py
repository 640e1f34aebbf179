"""Warn about secret files (TLS private keys, tenant-key files) that other users can reach.

A key file open to its group or to everyone leaks the credential to every local account
that can read it, as ssh says of a private key in mode 0644. kvmesh warns but does not
refuse (containers and secret mounts often show group bits the operator cannot change),
once per load, on the ``kvmesh.ops.file_perms`` logger (which reaches stderr even before logging
is configured, through Python's last-resort handler). Windows has no POSIX mode bits: nothing
is reported there.
"""
from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("kvmesh.ops.file_perms")


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


# --- directories and files that hold secrets -----------------------------------------------
# Unlike the key files above, these are kvmesh's own (the worker's disk tier): kvmesh makes
# them private and refuses what others could have prepared, rather than warning.

_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(
    os, "O_CLOEXEC", 0)


class UnsafePath(ValueError):
    """A path kvmesh will not keep secrets in: another user owns it, others may write it, or
    it is not what it must be (a symlink, a file where a directory belongs)."""


def private_dir(path: str | Path, what: str, *, follow: bool = True) -> Path:
    """``path`` as a directory only this user controls; returns it.

    Missing: created mode 0700 (missing parents with the usual modes). Existing: accepted only
    when it is a directory owned by this process's user that neither its group nor others may
    write (they could plant, swap or delete what it holds); otherwise :class:`UnsafePath`
    naming ``what`` (``"--disk-dir"``), and nothing is changed. An existing directory that
    others may read or enter is narrowed to 0700. ``follow=False``: a symlink at ``path``
    is refused (for directories kvmesh creates itself, inside one checked already);
    ``follow=True`` resolves it first and checks the target (the operator may point
    ``--disk-dir`` anywhere, but never at a directory someone else controls)."""
    p = Path(path)
    if follow:
        p = p.resolve()
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(p, 0o700)
        os.chmod(p, 0o700)  # whatever the umask: the mode is part of the contract
        return p
    except FileExistsError:
        pass
    _check_dir(p, what)
    return p


def check_private_dir(path: str | Path, what: str) -> None:
    """:func:`private_dir`'s refusals for an existing ``path`` (symlinks resolved), changing
    nothing; a missing ``path`` passes (it will be created private). For flag checks
    before anything starts."""
    p = Path(path).resolve()
    if os.path.lexists(p):
        _check_dir(p, what, narrow=False)


def _check_dir(p: Path, what: str, *, narrow: bool = True) -> None:
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(f"{what} {str(p)!r} is a symlink: refusing to follow it")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{what} {str(p)!r} exists and is not a directory")
    if os.name == "nt":
        return
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.geteuid():
        raise UnsafePath(f"{what} {str(p)!r} is owned by uid {st.st_uid}, not by this "
                         f"process's uid {os.geteuid()}: its owner could plant or read what "
                         f"it holds; use a directory of your own (mode 0700)")
    if mode & 0o022:
        raise UnsafePath(f"{what} {str(p)!r} is writable by "
                         f"{'everyone' if mode & 0o002 else 'its group'} (mode {mode:04o}): "
                         f"others could plant or swap what it holds; chmod 700 it")
    if mode & 0o077 and narrow:
        os.chmod(p, 0o700)
        log.warning("%s %r was open to other users (mode %04o): narrowed to 0700", what,
                    str(p), mode)


def create_private_file(path: str | Path, *chunks: bytes | memoryview) -> None:
    """Create ``path`` holding ``chunks`` (in order), mode 0600, with ``O_CREAT | O_EXCL |
    O_NOFOLLOW``: an existing file or a symlink planted at ``path`` makes it fail
    (``FileExistsError`` or ``OSError``) instead of being written through. A failed write
    removes the file."""
    fd = os.open(path, _NEW_FILE, 0o600)
    try:
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            while view:
                view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        Path(path).unlink(missing_ok=True)
        raise
    os.close(fd)


def open_to_others(fd: int, path: str | Path, what: str) -> bool:
    """Whether the open file ``fd`` (at ``path``) grants other users any access, after
    checking it is a regular file of this process's user (else :class:`UnsafePath` naming
    ``what``). The caller decides: narrow it, or refuse a secret that may have leaked."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(f"{what} {str(path)!r} exists and is not a regular file")
    if os.name == "nt":
        return False
    if st.st_uid != os.geteuid():
        raise UnsafePath(f"{what} {str(path)!r} is owned by uid {st.st_uid}, not by this "
                         f"process's uid {os.geteuid()}")
    return bool(stat.S_IMODE(st.st_mode) & 0o077)


def open_private_append(path: str | Path, what: str) -> int:
    """A file descriptor appending to ``path`` (``O_APPEND``: each write lands whole at the
    end), the file created mode 0600 when missing. A symlink at ``path`` is refused
    (``O_NOFOLLOW``: ``OSError``); an existing file must be a regular file of this
    process's user (else :class:`UnsafePath` naming ``what``) and is narrowed to 0600. The
    caller closes the descriptor."""
    flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK  # a FIFO must not block
             | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    fd = os.open(path, flags, 0o600)
    try:
        if open_to_others(fd, path, what):
            os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd
