"""What each Redis shard spent: ``INFO commandstats`` and ``INFO cpu`` of every node.

``commandstats`` ``usec`` is the time the server spent executing commands (scripts
included), its main thread's work for the index; ``used_cpu_user + used_cpu_sys`` is the
whole process (networking and parsing too). A :class:`Sample` is both, per node, at one
moment; the difference of two samples is what a phase cost.
"""
from __future__ import annotations

from dataclasses import dataclass

import redis

__all__ = ["Sample", "control_shard", "sample"]


@dataclass(frozen=True)
class Sample:
    """Counters of one node at one moment (cumulative since the server started)."""

    usec: int      # commandstats: microseconds executing commands
    calls: int     # commandstats: commands executed
    cpu_s: float   # used_cpu_user + used_cpu_sys
    keys: int      # DBSIZE

    def __sub__(self, other: Sample) -> Sample:
        return Sample(self.usec - other.usec, self.calls - other.calls,
                      self.cpu_s - other.cpu_s, self.keys - other.keys)


def sample(urls: list[str]) -> list[Sample]:
    """One :class:`Sample` per node URL (plain ``redis://`` URLs, one per shard)."""
    out = []
    for url in urls:
        with redis.Redis.from_url(url, socket_timeout=5) as c:
            stats = c.info("commandstats")
            cpu = c.info("cpu")
            out.append(Sample(sum(int(s["usec"]) for s in stats.values()),
                              sum(int(s["calls"]) for s in stats.values()),
                              float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
                              int(c.dbsize())))
    return out


def control_shard(urls: list[str]) -> int:
    """The index of the node holding the index's control slot ``{ctl}`` (0 on one server)."""
    from service.index.redis.keys import REGISTRY

    for i, url in enumerate(urls):
        with redis.Redis.from_url(url, socket_timeout=5) as c:
            try:
                if c.exists(REGISTRY):
                    return i
            except redis.ResponseError:  # MOVED: another node serves the slot
                continue
    return 0
