"""Peer KV transfer counters of one worker, both sides: what it fetched (as receiver) and
served (as source), the fetches that fell back to recompute and the refusals, by reason.

Written by the event loop (and the engine thread for the imported blocks), read by Stats and
the Prometheus scrape: plain numbers, each updated by one statement. ``latency`` holds one
observation per fetch and role ("receiver": plan to landed bytes; "source": request to the
bytes offered), in ``kvmesh_worker_peer_fetch_seconds``.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from kvmesh.v1 import worker_pb2
from worker.kv_io.onboard_log import OnboardLog


@dataclass
class PeerCounters:
    fetches: int = 0          # fetches made (a header came back)
    fetched_blocks: int = 0   # blocks landed, verified and imported
    fetched_bytes: int = 0    # bytes landed
    fallbacks: Counter[str] = field(default_factory=Counter)  # reason -> fetches
    served: int = 0           # fetches answered with a header
    served_blocks: int = 0    # blocks of offers fully sent
    served_bytes: int = 0
    engine_reads: int = 0     # served reads that waited for the engine thread (the run
    #                           went on in a host or disk tier: worker.engine.peer_read)
    refusals: Counter[str] = field(default_factory=Counter)   # reason -> refused calls
    peer_hit_tokens: int = 0  # prompt tokens admitted on imported blocks
    latency: OnboardLog = field(default_factory=OnboardLog)

    def fallback(self, reason: str) -> None:
        self.fallbacks[reason] += 1

    def refuse(self, reason: str) -> None:
        self.refusals[reason] += 1

    def to_pb(self) -> worker_pb2.PeerStats:
        return worker_pb2.PeerStats(
            fetches=self.fetches, fetched_blocks=self.fetched_blocks,
            fetched_bytes=self.fetched_bytes, fallbacks=sum(self.fallbacks.values()),
            served=self.served, served_blocks=self.served_blocks,
            served_bytes=self.served_bytes, refused=sum(self.refusals.values()),
            peer_hit_tokens=self.peer_hit_tokens, fallbacks_by_reason=dict(self.fallbacks))
