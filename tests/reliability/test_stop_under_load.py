"""``kvmesh up`` stops within 10 s of SIGTERM and leaves no process behind,
on a loaded host too (local backend, and the Ray backend with a Ray of its own).

The load: busy-loop processes, two per core, each ending by itself. What is left is judged
from ``/proc``: every process of the launcher's tree just before the signal (pid and start
time, so a reused pid is not mistaken for a survivor) must be gone, zombies aside, once the
launcher has exited.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.stopping import descendants
from deploy.waiting import wait_until
from tests.kvmesh_up import Up

pytestmark = pytest.mark.integration

STOP_S = 10.0  # what a supervisor waits before its SIGKILL


@contextlib.contextmanager
def cpu_load(seconds: float = 90.0) -> Iterator[None]:
    """Two busy loops per core (load average ~2x the cores), each gone after ``seconds``."""
    spin = f"import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.DEVNULL)
             for _ in range(2 * (os.cpu_count() or 1))]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _identity(pid: int) -> tuple[int, str] | None:
    """``(pid, start time)`` of a live (not zombie) process, else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in "ZX" else (pid, fields[19])


def tree(pid: int) -> set[tuple[int, str]]:
    """The live processes of ``pid``'s tree, ``pid`` included."""
    return {i for p in [pid, *descendants(pid)] if (i := _identity(p)) is not None}


def survivors(before: set[tuple[int, str]]) -> list[str]:
    """Those of ``before`` still running (command lines, for the failure message)."""
    out = []
    for pid, start in before:
        if _identity(pid) == (pid, start):
            with contextlib.suppress(OSError):
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                           .decode(errors="replace")[:120])
    return out


def _commands(pid: int) -> list[str]:
    out = []
    for p in descendants(pid):
        with contextlib.suppress(OSError):
            out.append(Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode())
    return out


def _sigterm_and_time(up: Up) -> tuple[float, set[tuple[int, str]]]:
    """SIGTERM ``up``; the seconds until it exited (inf past 30 s) and its tree before."""
    before = up.before = tree(up.proc.pid)  # type: ignore[attr-defined]
    t0 = time.monotonic()
    up.proc.terminate()
    try:
        up.proc.wait(30)
    except subprocess.TimeoutExpired:
        return float("inf"), before
    return time.monotonic() - t0, before


def _check(up: Up, took: float, before: set[tuple[int, str]]) -> None:
    up.reader.join(10)
    time.sleep(0.3)  # SIGKILLed processes leave /proc asynchronously
    left = survivors(before)
    assert took < STOP_S, f"stopping took {took:.1f}s:\n{up.tail()}"
    assert not left, f"left behind: {left}\n{up.tail()}"


def _kill_all(up: Up) -> None:
    """After a failed test: SIGKILL whatever of the launcher's tree is still there."""
    up.kill()
    for pid, start in getattr(up, "before", set()):
        if _identity(pid) == (pid, start):
            with contextlib.suppress(OSError):
                os.kill(pid, 9)


def test_sigterm_during_start_under_load_stops_in_time_and_leaves_nothing() -> None:
    """A supervisor stopping ``kvmesh up`` while it still starts its workers: the start is
    cut short (before the fix it ran to its end, tens of seconds on a loaded host)."""
    with cpu_load():
        up = Up("--workers", "2", "--port", "0", "--num-blocks", "64")
        try:
            # Valkey and the service are up, the first worker is loading
            wait_until(lambda: any("-m worker" in c for c in _commands(up.proc.pid)), 90,
                       interval=0.1, what="a worker process started")
            assert up.hint is None, "ready already: the start was not interrupted"
            took, before = _sigterm_and_time(up)
            _check(up, took, before)
        finally:
            _kill_all(up)


def test_sigterm_when_ready_under_load_stops_in_time_and_leaves_nothing() -> None:
    up = Up("--workers", "2", "--port", "0", "--num-blocks", "64")
    try:
        assert up.wait_ready(120), up.tail()
        with cpu_load():
            time.sleep(2.0)  # the load average climbs
            took, before = _sigterm_and_time(up)
            _check(up, took, before)
        assert up.lines[-1] == "stopped", up.tail()
    finally:
        _kill_all(up)


def test_ray_backend_sigterm_under_load_stops_in_time_and_leaves_nothing() -> None:
    """With a Ray of its own: GCS, raylet, Ray workers and the actors' children too."""
    up = Up("--backend", "ray", "--workers", "1", "--port", "0", "--num-blocks", "32")
    try:
        assert up.wait_ready(180), up.tail()
        with cpu_load():
            time.sleep(2.0)
            took, before = _sigterm_and_time(up)
            assert len(before) >= 4, before  # ray's own processes at least
            _check(up, took, before)
    finally:
        _kill_all(up)


def test_a_bench_run_sigterm_under_load_stops_in_time_and_leaves_nothing() -> None:
    """``kvmesh bench`` has no stop loop: before the fix Python's default SIGTERM ended it
    at once and its Valkey stayed behind."""
    kvmesh = str(Path(sys.executable).parent / "kvmesh")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVMESH_")}
    bench = subprocess.Popen(
        [kvmesh, "bench", "fleet", "--workers", "1", "--phase-s", "30", "--limit", "50"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    before: set[tuple[int, str]] = set()
    try:
        with cpu_load():
            wait_until(lambda: {"valkey", "-m service"} <= {
                w for c in _commands(bench.pid) for w in ("valkey", "-m service") if w in c},
                90, interval=0.1, what="the bench's Valkey and service started")
            before = tree(bench.pid)
            t0 = time.monotonic()
            bench.terminate()
            try:
                bench.wait(30)
                took = time.monotonic() - t0
            except subprocess.TimeoutExpired:
                took = float("inf")
            time.sleep(0.3)
            assert took < STOP_S, f"stopping took {took:.1f}s"
            assert not survivors(before), survivors(before)
    finally:
        bench.kill()
        bench.wait()
        for pid, start in before:
            if _identity(pid) == (pid, start):
                with contextlib.suppress(OSError):
                    os.kill(pid, 9)
