"""A kvmesh server as a child process that announces where it listens.

Both ``kvmesh service`` and ``kvmesh worker`` print one line ``... listening on HOST:PORT``
once they accept calls; :class:`ServerProcess` starts the child, waits for that line and
keeps the rest of its output (the last lines, for error messages). Children die with the
launcher (``kvmesh.lifecycle``) so a killed launcher leaves nothing behind.
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
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1",
                    "KVMESH_PARENT_PID": str(os.getpid()), **(env or {})}
        self.address: str | None = None
        self.lines: collections.deque[str] = collections.deque(maxlen=200)
        self.proc: subprocess.Popen | None = None
        self._ready = threading.Event()

    def start(self, timeout: float = 60.0) -> ServerProcess:
        self._ready.clear()
        self.address = None
        self.proc = subprocess.Popen(
            self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True, bufsize=1, env=self.env, cwd=self.cwd, start_new_session=True)
        threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()
        if not self._ready.wait(timeout) or self.address is None:
            tail = self.tail()
            self.kill()
            raise RuntimeError(f"{self.name} did not come up within {timeout:.0f}s:\n{tail}")
        return self

    def _drain(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            if self.echo:
                print(f"[{self.name}] {line}", file=sys.stderr, flush=True)
            m = _READY.search(line)
            if m and self.address is None:
                self.address = m.group(1)
                self._ready.set()
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
