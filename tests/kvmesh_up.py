"""`kvmesh up` as a subprocess, for the tests of the launcher itself (local and Ray)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path


class Up:
    """``kvmesh up ARGS`` with its output lines collected as they come.

    The child gets this environment without any ``KVMESH_*`` variable of the shell running
    the tests, plus ``env``. :meth:`wait_ready` returns once it printed its ``ready:`` hint
    or exited, whichever comes first.
    """

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        kvmesh = str(Path(sys.executable).parent / "kvmesh")
        base = {k: v for k, v in os.environ.items() if not k.startswith("KVMESH_")}
        self.proc = subprocess.Popen(
            [kvmesh, "up", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env={**base, "PYTHONUNBUFFERED": "1", **(env or {})})
        self.lines: list[str] = []
        self._settled = threading.Event()  # the hint printed, or the output ended
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("ready:"):
                self._settled.set()
        self._settled.set()

    @property
    def hint(self) -> str | None:
        """The ``ready:`` line, once printed."""
        return next((ln for ln in self.lines if ln.startswith("ready:")), None)

    def wait_ready(self, timeout: float) -> bool:
        """Whether the cluster printed its ``ready:`` hint within ``timeout`` seconds."""
        self._settled.wait(timeout)
        return self.hint is not None

    def field(self, kind: str) -> list[str]:
        """The values of the ``KIND VALUE`` lines, e.g. ``field("service")``."""
        return [ln.split()[1] for ln in self.lines if ln.startswith(f"{kind} ")]

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.lines[-n:])

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, then its exit code; every output line is read by then."""
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self.reader.join(10)
        return code

    def kill(self) -> None:
        """SIGKILL if still running (cleanup after a failed test)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
