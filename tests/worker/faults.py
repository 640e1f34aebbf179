"""A model forward that fails on demand: the test side of a broken GPU step.

Production code has no failpoint; tests wrap an engine's model instead.
"""
from __future__ import annotations

from worker import Engine


class FailingForward:
    """Wraps ``engine.model.forward``: the calls numbered in ``calls`` (from 1) raise, or,
    with no numbers, every call while ``failing`` is set. It raises before any KV is
    written, as an out-of-memory error at the first layer would."""

    def __init__(self, engine: Engine, *calls: int) -> None:
        self.forward = engine.model.forward
        self.fail_at = set(calls)
        self.failing = not calls
        self.calls = 0
        engine.model.forward = self

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.failing or self.calls in self.fail_at:
            raise RuntimeError("CUDA error: out of memory (injected)")
        return self.forward(*args, **kwargs)
