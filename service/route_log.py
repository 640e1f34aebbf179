"""The route log: one JSON line per routing decision, to see what the router did and why.

``kvmesh service --route-log FILE`` (off by default). Every Route that routes appends one
line (dry runs do not): the policy, and per candidate its match, cost, load, load age and
cost terms. A line never holds token ids, salts or other prompt content. The file is 0600,
each line one ``write``; a failed write never fails a Route.

See docs/architecture.md#routing-in-the-service.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from service.liveness import WorkerTable
from service.policy import KvmeshPolicy, Policy, Ranked

log = logging.getLogger("kvmesh.service.route_log")

_LOAD_FIELDS = ("running", "waiting", "queued_prefill_tokens", "free_blocks",
                "free_empty_blocks", "decode_tokens", "fetch_us_per_block", "fetch_us_per_call",
                "peer_fetch")


def decision(now_ms: int, policy: Policy, prompt_tokens: int, ranked: list[Ranked],
             table: WorkerTable, degraded: bool = False) -> dict[str, Any]:
    """The log record of one decision (see the module docstring): ``ranked`` as ``policy``
    returned it, ages and pending work read from ``table`` BEFORE the chosen worker's
    routed work is added."""
    kvmesh = isinstance(policy, KvmeshPolicy)
    backlog = KvmeshPolicy.backlog([r.view for r in ranked]) if kvmesh else 0
    out = []
    for r in ranked:
        v = r.view
        rec = table.get(v.worker_id)
        requests, tokens = table.routed_since_heartbeat(rec) if rec is not None else (0, 0)
        cand: dict[str, Any] = {
            "worker": v.worker_id,
            "matched": {"gpu": v.match.gpu, "cpu": v.match.cpu, "disk": v.match.disk},
            "cost": r.cost,
            "load": {f: getattr(v.load, f) for f in _LOAD_FIELDS},
            "load_age_ms": max(now_ms - rec.heartbeat_ms, 0) if rec is not None else None,
            "pending": {"requests": requests, "tokens": tokens}}
        if kvmesh:
            cand["terms"] = policy.terms(prompt_tokens, v, backlog)
        if r.fetch is not None:  # run here after pulling these blocks from a peer
            cand["fetch"] = {"source": r.fetch.source.worker_id,
                             "start_block": r.fetch.start_block, "blocks": r.fetch.blocks,
                             "est_s": r.fetch.est_s}
        out.append(cand)
    return {"t_ms": now_ms, "policy": policy.name, "degraded": degraded,
            "prompt_tokens": prompt_tokens, "candidates": out}


class RouteLog:
    """An open route log; :meth:`write` appends one record, :meth:`close` ends it."""

    def __init__(self, path: str | Path) -> None:
        from kvmesh.ops.file_perms import open_private_append

        self.path = str(path)
        self._fd: int | None = open_private_append(path, "--route-log")
        self._failed = False

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` as one line (never raises: see the module docstring)."""
        if self._fd is None:
            return
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        try:
            os.write(self._fd, line)
        except OSError as e:
            if not self._failed:
                log.warning("route log %s: write failed, dropping lines: %s", self.path, e)
                self._failed = True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
