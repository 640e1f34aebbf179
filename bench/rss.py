"""Resident memory of processes over time, and whether it has stopped growing.

``rss_mib(pid)`` reads one process's RSS. ``trends(samples, warmup_s)`` turns periodic
samples (``{"t": s, "rss_mib": {name: MiB}, "pid": {name: pid}}``) into one
:class:`RssTrend` per process *incarnation*: a name that comes back with a new pid (a
restarted service replica) is a new series, since a restart resets its memory and would
hide a leak. Each series drops the first ``warmup_s`` of its own life (model load, first
requests, caches filling), then reports first / last / max RSS and the growth rate, as a
least-squares slope in MiB per minute, over the first and the second half of the rest. A
process whose memory is bounded shows a second-half rate near zero whatever the first half
did; a leak keeps a positive one. ``FLAT_MIB_PER_MIN`` is the line between the two.
"""
from __future__ import annotations

from dataclasses import dataclass

FLAT_MIB_PER_MIN = 1.0   # well above allocator noise over minutes; a real leak exceeds it
MIN_SAMPLES = 6          # per series, after its warm-up: three per half at least


def rss_mib(pid: int | None) -> float:
    """Resident set size of ``pid`` in MiB (0 when it is gone)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of ``(seconds, MiB)`` points, in MiB per minute (0 for < 2)."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return 60.0 * sum((t - mt) * (v - mv) for t, v in points) / var


@dataclass(frozen=True)
class RssTrend:
    """One process incarnation's warm RSS series, summarized (MiB, MiB/min, seconds)."""

    name: str
    pid: int
    samples: int
    start_s: float
    end_s: float
    first: float
    last: float
    max: float
    early_rate: float   # over the first half of the warm series
    late_rate: float    # over the second half: ~0 once memory stopped growing

    @property
    def enough(self) -> bool:
        return self.samples >= MIN_SAMPLES

    @property
    def flat(self) -> bool:
        return self.late_rate <= FLAT_MIB_PER_MIN

    def verdict(self) -> str:
        if not self.enough:
            return "too short to tell"
        return "flat" if self.flat else "STILL GROWING"


def trends(samples: list[dict], warmup_s: float) -> list[RssTrend]:
    """One trend per (name, pid) seen in ``samples``, in order of first appearance."""
    series: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for s in samples:
        for name, mib in s["rss_mib"].items():
            if mib > 0:
                series.setdefault((name, s["pid"][name]), []).append((s["t"], mib))
    out = []
    for (name, pid), points in series.items():
        born = points[0][0]
        warm = [p for p in points if p[0] >= born + warmup_s] or points[-1:]
        mid = (warm[0][0] + warm[-1][0]) / 2
        values = [v for _, v in warm]
        out.append(RssTrend(
            name=name, pid=pid, samples=len(warm), start_s=warm[0][0], end_s=warm[-1][0],
            first=values[0], last=values[-1], max=max(values),
            early_rate=slope_per_min([p for p in warm if p[0] <= mid]),
            late_rate=slope_per_min([p for p in warm if p[0] >= mid])))
    return out


def table(rows: list[RssTrend], warmup_s: float) -> list[str]:
    """Printable lines: one per trend, then a verdict over those long enough to judge."""
    lines = [f"RSS per process after its first {warmup_s:.0f} s (MiB; rates: least-squares "
             "MiB/min over the first and second half of that time)",
             f"  {'process':<12} {'pid':>7} {'from s':>7} {'to s':>7} {'first':>7} "
             f"{'last':>7} {'max':>7} {'1st half':>9} {'2nd half':>9}"]
    for r in rows:
        lines.append(f"  {r.name:<12} {r.pid:>7} {r.start_s:>7.0f} {r.end_s:>7.0f} "
                     f"{r.first:>7.1f} {r.last:>7.1f} {r.max:>7.1f} {r.early_rate:>+9.2f} "
                     f"{r.late_rate:>+9.2f}  {r.verdict()}")
    judged = [r for r in rows if r.enough]
    if not judged:
        lines.append(f"RSS stopped growing: cannot tell (no process has {MIN_SAMPLES} warm "
                     "samples; run longer or sample more often)")
    else:
        growing = [f"{r.name}({r.pid})" for r in judged if not r.flat]
        lines.append(f"RSS stopped growing: {'no' if growing else 'yes'} ("
                     f"{len(judged) - len(growing)} of {len(judged)} processes with "
                     f"{MIN_SAMPLES}+ warm samples grow <= {FLAT_MIB_PER_MIN} MiB/min over "
                     "their second half" + (f"; growing: {', '.join(growing)}" if growing
                                            else "") + ")")
    return lines
