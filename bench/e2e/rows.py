"""The rows of ``kvmesh bench e2e``: which fresh cluster each row runs.

A row is a policy variant (``bench.variants``: ``kvmesh[saturation_weight=0]`` runs kvmesh
with that cost weight in every service replica), without or with the CPU tier (label
``+cpu``), on this tree's code or, for ``kvmesh@REV`` (``--against REV``), on git revision
``REV``'s (``bench.revision``); with ``--route-log DIR`` its service replicas log their
routes to ``DIR/<label>/``. With ``--peer-fetch`` plain kvmesh runs twice: ``kvmesh+fetch``
(the services plan peer KV fetches, ``--peer-fetch``) and ``kvmesh`` (``--no-peer-fetch``);
the other rows keep each process's default (the service's is off). :func:`preflight`
refuses what would fail or mislead only after minutes of benchmarking: a revision git does
not know, a log directory holding logs already (they would be analysed with the new ones).
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

from bench.revision import repo_root
from bench.variants import Variant


@dataclass(frozen=True)
class Setup:
    """One row: ``variant`` on a fresh cluster with ``cpu_blocks`` CPU-tier blocks per
    worker, running ``code_dir``'s tree (None: this one), logging its routes to
    ``route_log_dir`` (None: no log), its peer fetch switched by ``peer_fetch`` (None: the
    processes' defaults)."""

    label: str
    variant: Variant
    cpu_blocks: int = 0
    code_dir: str | None = None
    route_log_dir: str | None = None
    peer_fetch: bool | None = None


FETCH = "+fetch"  # the label suffix of a row whose services plan peer fetches


def setups(variants: list[Variant], cpu_blocks: int = 0,
           route_log: str | None = None, peer_fetch: bool = False) -> list[Setup]:
    """This tree's rows: each variant, then (when ``cpu_blocks``) again with the CPU tier;
    with ``peer_fetch``, plain kvmesh first with fetch (``kvmesh+fetch``), then without."""
    out = []
    for v in variants:
        fetch = (True, False) if peer_fetch and v.label == "kvmesh" else (None,)
        for cpu in ((0, cpu_blocks) if cpu_blocks else (0,)):
            for f in fetch:
                label = (f"{v.label}+cpu" if cpu else v.label) + (FETCH if f else "")
                out.append(Setup(label, v, cpu, None,
                                 str(Path(route_log) / label) if route_log else None, f))
    return out


def revision_setups(rev: str, tree: Path | None, service_flags: frozenset[str],
                    cpu_blocks: int = 0, route_log: str | None = None) -> list[Setup]:
    """The ``kvmesh@REV`` rows, run from ``tree`` (``rev``'s code): plain kvmesh (no cost
    weights: an old service may not take the flag), logging routes only where ``rev``'s
    service knows ``--route-log`` (``service_flags``)."""
    log = route_log if "--route-log" in service_flags else None
    out = []
    for s in setups([Variant("kvmesh")], cpu_blocks):
        label = f"kvmesh@{rev}{s.label.removeprefix('kvmesh')}"
        out.append(replace(s, label=label, code_dir=str(tree) if tree else None,
                           route_log_dir=str(Path(log) / label) if log else None))
    return out


def preflight(variants: list[Variant], cpu_blocks: int = 0, against: str | None = None,
              route_log: str | None = None) -> None:
    """``ValueError`` for what the run would trip on late (see the module docstring)."""
    todo = setups(variants, cpu_blocks, route_log)
    if against:
        res = subprocess.run(["git", "-C", str(repo_root()), "rev-parse", "--verify",
                              "--quiet", f"{against}^{{commit}}"], capture_output=True)
        if res.returncode:
            raise ValueError(f"--against {against}: not a commit of this repository")
        todo += revision_setups(against, None, frozenset({"--route-log"}), cpu_blocks,
                                route_log)
    for s in todo:
        if s.route_log_dir and any(Path(s.route_log_dir).rglob("*.jsonl")):
            raise ValueError(f"{s.route_log_dir} holds route logs of an earlier run: give "
                             "--route-log an empty directory")
