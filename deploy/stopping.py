"""Stopping a launcher within one deadline, leaving no process behind, whatever the load.

:class:`StopDeadline` makes the process a child subreaper (so orphans stay findable) and
watches signals on a thread: the first signal starts the clock, and at ``deadline_s`` every
descendant is SIGKILLed and the process ends, wherever the main thread is. :func:`budget` is
what a cluster's ``stop`` may spend; :func:`guard_command` does the same for a foreground
command; :func:`end_descendants` ends and reaps what is left.

See docs/architecture.md#local-launcher-and-stopping.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["DEADLINE_S", "StopDeadline", "budget", "descendants", "end_descendants",
           "guard_command"]

DEADLINE_S = 9.0  # first signal -> process gone; a supervisor's SIGKILL comes at 10 s
GRACE_S = 1.5     # what end_descendants leaves SIGTERMed processes before SIGKILL
PR_SET_CHILD_SUBREAPER = 36
RESERVE_S = 2.5   # of the deadline, kept for end_descendants and the exit itself

_active: StopDeadline | None = None  # the installed one (one per process: signals are)


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process (``/proc``; state Z included)."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:  # "pid (comm) state ppid ...": comm may hold spaces and parentheses
            out[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return out


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except (OSError, IndexError):
        return True


def descendants(pid: int | None = None, *, live_only: bool = True) -> list[int]:
    """Every descendant of ``pid`` (default: this process), children first; ``live_only``:
    zombies left out (they hold no resource but their pid)."""
    root = os.getpid() if pid is None else pid
    kids: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        kids.setdefault(parent, []).append(child)
    out, todo = [], [root]
    while todo:
        for k in kids.get(todo.pop(0), []):
            out.append(k)
            todo.append(k)
    return [p for p in out if not (live_only and _zombie(p))]


def _signal_all(pids: list[int], sig: int) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)


def _reap() -> None:
    """Collect this process's exited children (those no ``Popen`` waits for any more)."""
    for p in descendants(live_only=False):
        if _zombie(p):
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(p, os.WNOHANG)


def end_descendants(grace_s: float = GRACE_S, deadline: float | None = None) -> int:
    """SIGTERM every descendant, SIGKILL what is left after ``grace_s`` (or at ``deadline``,
    a ``time.monotonic()`` value, if sooner); returns how many there were."""
    first = descendants()
    if not first:
        _reap()
        return 0
    _signal_all(first, signal.SIGTERM)
    until = time.monotonic() + grace_s
    if deadline is not None:
        until = min(until, deadline)
    while time.monotonic() < until and descendants():
        time.sleep(0.05)
    for _ in range(50):  # a child forked meanwhile is found by the next scan
        left = descendants()
        if not left:
            break
        _signal_all(left, signal.SIGKILL)
        time.sleep(0.02)
    _reap()
    return len(first)


def become_subreaper() -> bool:
    """Make orphaned descendants this process's children (Linux); whether it worked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1) == 0
    except OSError:
        return False


class StopDeadline:
    """One deadline for stopping this launcher; see the module contract."""

    def __init__(self, deadline_s: float = DEADLINE_S,
                 on_kill: Callable[[int], None] | None = None) -> None:
        self.deadline_s = deadline_s
        self.stop = threading.Event()
        self.interrupt = True  # until the launcher says it is ready
        self.signalled_at: float | None = None
        self._on_kill = on_kill
        self.armed = True  # False once uninstalled: the watchdog then does nothing
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)

    def install(self) -> StopDeadline:
        """Subreaper, handlers and watchdog (call from the main thread; again after a
        library replaced the handlers, e.g. ``ray.init``)."""
        global _active
        _active = self
        become_subreaper()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        if not getattr(self, "_watching", False):
            self._watching = True
            threading.Thread(target=self._watch, name="stop-deadline", daemon=True).start()
        return self

    def uninstall(self) -> None:
        """Undo :func:`guard_command`'s installation (a no-op for other instances)."""

    def ready(self) -> None:
        """From now on a signal only sets ``stop`` (the launcher's loop then stops)."""
        self.interrupt = False

    def remaining(self, reserve_s: float = 0.0) -> float:
        """Seconds left of the deadline, less ``reserve_s`` (the full span before a signal)."""
        start = self.signalled_at if self.signalled_at is not None else time.monotonic()
        return max(0.0, start + self.deadline_s - reserve_s - time.monotonic())

    def _mark(self) -> None:
        if self.signalled_at is None:
            self.signalled_at = time.monotonic()
        self.stop.set()

    def _handle(self, signum: int, frame: object) -> None:
        self._mark()
        with contextlib.suppress(OSError):  # wake the watchdog should a library have
            os.write(self._wake_w, bytes([signum]))  # replaced the wakeup fd
        if self.interrupt:
            self.interrupt = False  # once: the cleanup that follows must not be cut
            raise KeyboardInterrupt

    def _watch(self) -> None:
        # The C-level handler writes the signal number here at once, whatever the main
        # thread is doing; the Python handler may run much later.
        while True:
            data = os.read(self._wake_r, 64)
            if any(b in (signal.SIGINT, signal.SIGTERM) for b in data):
                break
        if not self.armed:
            return
        self._mark()
        time.sleep(self.remaining())
        left = descendants()
        _signal_all(left, signal.SIGKILL)
        if self._on_kill is not None:
            with contextlib.suppress(Exception):
                self._on_kill(len(left))
        os._exit(1)


def budget(timeout: float, reserve_s: float = RESERVE_S) -> float:
    """``timeout``, or what is left of the stop deadline (less ``reserve_s``) if that is
    less: once a signal came, every stop fits the one deadline (at least 0.5 s)."""
    d = _active
    if d is None or d.signalled_at is None:
        return timeout
    return max(0.5, min(timeout, d.remaining(reserve_s)))


def guard_command(deadline_s: float = DEADLINE_S) -> StopDeadline | None:
    """Guard a foreground command (see the module contract); None off the main thread,
    where signal handlers cannot be installed (the caller's own handling then applies)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    guard = StopDeadline(deadline_s).install()

    def at_exit() -> None:
        if not guard.armed:
            return
        end_descendants(deadline=time.monotonic() + guard.remaining(0.5))
        if guard.signalled_at is not None:
            # stopped by a signal: the interpreter's finalizers (gRPC's, Ray's) may take
            # seconds on a loaded host, and no thread runs to cut them short
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(128 + signal.SIGTERM)

    def uninstall() -> None:
        """The command ended without a signal (run in-process, say by a test): put the
        process back as it was. After a signal everything stays: the process is ending."""
        global _active
        if guard.signalled_at is not None or not guard.armed:
            return
        guard.armed = False
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(-1)
        with contextlib.suppress(OSError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 0)
        atexit.unregister(at_exit)
        if _active is guard:
            _active = None

    guard.uninstall = uninstall  # type: ignore[method-assign]
    atexit.register(at_exit)
    return guard
