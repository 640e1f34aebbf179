"""Worker views for the policy tests: a match and a load, nothing else."""
from __future__ import annotations

from service.index.base import BlockMatch, WorkerLoad
from service.policy import WorkerView


def view(wid: str, blocks: int = 0, cpu: int = 0, bs: int = 16, **load: int) -> WorkerView:
    """Worker ``wid`` holding ``blocks`` of the prompt (the last ``cpu`` of them on its CPU
    tier) under ``load``."""
    return WorkerView(wid, f"{wid}:1", WorkerLoad(**load),
                      BlockMatch(blocks, blocks - cpu, cpu, 0), bs)


def ids(ranked: list) -> list[str]:
    return [r.view.worker_id for r in ranked]
