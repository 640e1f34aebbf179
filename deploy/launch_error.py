"""Start failures a user can fix, said in one line.

:class:`LaunchError`'s ``str()`` is that one line, naming the cause and the flag (``kvmesh up``
prints ``error: <line>`` and exits 1; any other exception keeps its traceback).
:class:`ChildExited` is a child that ended before it was ready; :func:`cause_of` picks the
line of its output that says why.

See docs/architecture.md#local-launcher-and-stopping.
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
