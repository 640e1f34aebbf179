"""A kvmesh server as a child process that announces where it listens.

Both ``kvmesh service`` and ``kvmesh worker`` print one line ``... listening on HOST:PORT``
once they accept calls; :class:`ServerProcess` starts the child, waits for that line and
keeps the rest of its output (the last lines, for error messages). Children die with the
launcher (``kvmesh.ops.lifecycle``) so a killed launcher leaves nothing behind.

A child that ends before that line raises :class:`deploy.launch_error.ChildExited` at once
(not at the timeout), naming the line of its output that says why; children print plain
tracebacks (``TYPER_STANDARD_TRACEBACK``, unless the environment sets it), whose last line
is the exception, where typer's boxed ones would wrap it over several.
"""
from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time

from deploy.launch_error import ChildExited, LaunchError, cause_of

_READY = re.compile(r"listening on (\S+)")


class ServerProcess:
    """One child: ``python -m <module> <args>``; ``.address`` once :meth:`start` returns."""

    def __init__(self, name: str, module: str, args: list[str], *, echo: bool = False,
                 env: dict[str, str] | None = None, cwd: str | None = None) -> None:
        """``env``: added to this process's environment; ``cwd``: the child's working
        directory (``-m`` puts it FIRST on the child's ``sys.path``, before ``PYTHONPATH``:
        a child meant to import another source tree must run from that tree)."""
        self.name = name
        self.cmd = [sys.executable, "-m", module, *args]
        self.cwd = cwd
        self.echo = echo
        self.env = {"TYPER_STANDARD_TRACEBACK": "1", **os.environ, "PYTHONUNBUFFERED": "1",
                    "KVMESH_PARENT_PID": str(os.getpid()), **(env or {})}
        self.address: str | None = None
        self.ready_line: str | None = None  # the "listening on" line (the service names its
        #                                     policy there)
        self.lines: collections.deque[str] = collections.deque(maxlen=200)
        self.proc: subprocess.Popen | None = None
        self._ready = threading.Event()
        self._output_ended = False  # its output closed: it has ended (or is ending)

    def start(self, timeout: float = 60.0) -> ServerProcess:
        """Start the child and return once it listens. Raises ``ChildExited`` as soon as it
        ends before that, ``LaunchError`` when it is still silent after ``timeout`` s (it is
        killed then)."""
        self._ready.clear()
        self._output_ended = False
        self.address = self.ready_line = None
        self.proc = subprocess.Popen(
            self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True, bufsize=1, env=self.env, cwd=self.cwd, start_new_session=True)
        threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()
        if not self._ready.wait(timeout) or self.address is None:
            if self._output_ended or not self.alive:
                raise self.exited()
            self.kill()
            raise LaunchError(f"{self.name} did not come up within {timeout:.0f}s (last "
                              f"output: {cause_of(self.lines)})")
        return self

    def exited(self) -> ChildExited:
        """The failure of this child, which ended: its exit code and the cause it printed."""
        code = None
        if self.proc is not None:
            try:  # its output ended: the exit follows at once
                code = self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()
        return ChildExited(self.name, code, cause_of(self.lines))

    def _drain(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            if self.echo:
                print(f"[{self.name}] {line}", file=sys.stderr, flush=True)
            m = _READY.search(line)
            if m and self.address is None:
                self.address, self.ready_line = m.group(1), line
                self._ready.set()
        self._output_ended = True
        self._ready.set()  # exited: wake start() so it reports the failure at once

    def tail(self, n: int = 30) -> str:
        return "\n".join(list(self.lines)[-n:])

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def terminate(self) -> None:
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> bool:
        """Wait for exit; SIGKILL after ``timeout``. Returns whether it exited by itself."""
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            self.kill()
            return False

    def kill(self) -> None:
        """SIGKILL, like a crash."""
        if self.alive:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout: float = 5.0) -> None:
        self.terminate()
        self.wait(timeout)


def wait_all(procs: list[ServerProcess], timeout: float) -> None:
    """SIGTERM all, then wait for all within one shared deadline (SIGKILL past it)."""
    for p in procs:
        p.terminate()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.wait(max(0.1, deadline - time.monotonic()))
