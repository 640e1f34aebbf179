"""Launched servers end with their launcher, even when it is killed with SIGKILL."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from deploy.waiting import wait_until

LAUNCHER = textwrap.dedent("""
    import time
    from deploy.process import ServerProcess
    p = ServerProcess("service", "service", ["--port", "0", "--backend", "memory"]).start()
    print(p.pid, flush=True)
    time.sleep(120)
""")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie is gone for our purpose (its parent died; init reaps it)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_children_die_with_a_killed_launcher():
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE,
                                text=True, cwd=os.getcwd())
    try:
        child = int(launcher.stdout.readline())
        assert not _gone(child)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        wait_until(lambda: _gone(child), timeout=10)
    finally:
        launcher.kill()
