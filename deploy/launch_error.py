"""Start failures a user can fix, said in one line.

A launcher (``kvmesh up``, local or Ray) fails to start for reasons its user causes and can
fix: a port already taken, a model directory that is missing or unreadable, no Valkey/Redis
server to start, a Ray address where nothing answers. Each must end the command with ONE
line that names the cause and the flag to change, not a traceback whose cause sits at the
bottom of a child's output.

Contract:

- :class:`LaunchError` is such a failure; ``str()`` is that one line (no newline).
  ``kvmesh up`` prints it as ``error: <line>`` on stderr, last, and exits 1; any other
  exception is a bug and keeps its traceback.
- :class:`ChildExited` is a child server that ended before it was ready: it carries the
  child's name, exit code and :func:`cause_of` its output, so the launcher that knows what
  the child was for (service replica, worker) can name the flag.
- :func:`cause_of` picks, from a child's output, the line that says why it ended: the last
  ``error: ...`` line (kvmesh commands' own one-line errors), else the last line of a
  traceback (``SomeError: message``; the launchers start children with plain tracebacks,
  see ``deploy.process``), else the last non-blank line.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["ChildExited", "LaunchError", "cause_of"]

# "RuntimeError: ...", "grpc.aio.AioRpcError: ...", "ray.exceptions.ActorDiedError: ..."
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit)\b:?")


class LaunchError(RuntimeError):
    """A start that failed for a reason the user can fix; ``str()`` is one line naming the
    cause and the flag to change."""

    def __init__(self, line: str) -> None:
        super().__init__(" ".join(line.split()))  # one line, whatever the parts held


class ChildExited(LaunchError):
    """Child ``name`` ended (exit ``code``, None if unknown) before it said it was ready."""

    def __init__(self, name: str, code: int | None, cause: str) -> None:
        self.name, self.code, self.cause = name, code, cause
        how = f"exited with code {code}" if code is not None else "exited"
        super().__init__(f"{name} {how}: {cause}")


def cause_of(lines: Iterable[str]) -> str:
    """The line of a child's output that says why it ended (see the module contract);
    ``"no output"`` when it printed nothing."""
    lines = [ln.strip() for ln in lines if ln.strip()]
    for pick in (lambda ln: ln.startswith("error: "), _EXCEPTION_LINE.match):
        found = [ln for ln in lines if pick(ln)]
        if found:
            return found[-1].removeprefix("error: ")
    return lines[-1] if lines else "no output"
