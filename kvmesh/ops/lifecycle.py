"""Child processes that end with their launcher.

A launcher (``kvmesh up``, the test clusters) sets ``KVMESH_PARENT_PID`` in a child's
environment; the child then asks the kernel to send it SIGTERM when that parent dies
(Linux ``PR_SET_PDEATHSIG``), so a launcher killed with SIGKILL leaves nothing behind.

The child does this itself at start rather than the launcher in a ``preexec_fn``: a
``preexec_fn`` forces a plain ``fork()`` of the launcher, and forking a process whose gRPC
threads are running can abort the child inside gRPC's fork handlers.

It lives in ``kvmesh/`` rather than ``deploy/`` because it is a contract between the floors:
``deploy/`` launchers set the variable, and the entry points of ``worker/`` and ``service/``
(which may import only ``kvmesh/``) arm the signal.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Arm SIGTERM-on-parent-death if a launcher asked for it; exit if it is already gone."""
    want = os.environ.get("KVMESH_PARENT_PID")
    if not want or not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        return
    if os.getppid() != int(want):  # the launcher died before we armed the signal
        raise SystemExit(0)
