"""The synthetic index of `kvmesh bench index`: chains of blocks, who holds what, as events.

Layout (deterministic for a seed): ``chains`` chains of ``chain_blocks`` random 32-byte block
hashes (sha256-sized; what the hashes are does not matter to the index). Chain ``c`` is held
by ``holders`` workers: holder ``j`` (worker ``(c * holders + j) % workers``) holds the first
``ceil(chain_blocks * (holders - j) / holders)`` blocks, so the first holder has the whole
chain and the others shorter prefixes, as after tail-first eviction. One (block, worker) pair
is one index *entry*; :func:`plan` picks the number of chains that reaches ``entries``.

Each worker publishes its prefixes as BlockStored events of ``event_blocks`` blocks (each
event's parent is the block before it, the first one starts the chain), ``batch_events``
events per ``apply_events`` call, seqs consecutive per worker.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from service.index.base import IndexEvent, IndexRemoved, IndexStored


@dataclass(frozen=True)
class Layout:
    workers: int = 64
    chain_blocks: int = 128       # 2,048 tokens at block size 16
    holders: int = 4
    event_blocks: int = 16
    batch_events: int = 32

    def held(self, j: int) -> int:
        """Blocks of a chain its ``j``-th holder holds."""
        return math.ceil(self.chain_blocks * (self.holders - j) / self.holders)

    @property
    def entries_per_chain(self) -> int:
        return sum(self.held(j) for j in range(self.holders))


@dataclass
class Dataset:
    """Chains, their holders and the resulting entry count."""

    layout: Layout
    worker_ids: list[str]
    chains: list[list[bytes]]
    holders_of: list[list[int]]   # chain -> worker indexes, first holder first

    @property
    def entries(self) -> int:
        return len(self.chains) * self.layout.entries_per_chain

    @property
    def distinct_blocks(self) -> int:
        return len(self.chains) * self.layout.chain_blocks

    def expected(self, chain: int) -> dict[str, int]:
        """worker id -> blocks a full lookup of chain ``chain`` must report."""
        return {self.worker_ids[w]: self.layout.held(j)
                for j, w in enumerate(self.holders_of[chain])}

    def batches(self, worker: int) -> list[list[IndexEvent]]:
        """The event batches worker ``worker`` publishes to index everything it holds."""
        lay = self.layout
        events: list[IndexEvent] = []
        for c, hs in enumerate(self.holders_of):
            if worker not in hs:
                continue
            chain = self.chains[c][:lay.held(hs.index(worker))]
            for a in range(0, len(chain), lay.event_blocks):
                op = IndexStored(tuple(chain[a:a + lay.event_blocks]), chain[a - 1] if a else b"")
                events.append(IndexEvent(len(events) + 1, op))
        return [events[i:i + lay.batch_events]
                for i in range(0, len(events), lay.batch_events)]


    def evictions(self, worker: int) -> list[list[IndexEvent]]:
        """Batches of BlockRemoved events by which worker ``worker`` evicts the tail half of
        every prefix it holds (the last ``held - held // 2`` blocks, tail first), seqs
        continuing after :meth:`batches`."""
        lay = self.layout
        seq = sum(len(b) for b in self.batches(worker))
        events: list[IndexEvent] = []
        for c, hs in enumerate(self.holders_of):
            if worker not in hs:
                continue
            held = lay.held(hs.index(worker))
            tail = self.chains[c][held // 2:held][::-1]
            for a in range(0, len(tail), lay.event_blocks):
                seq += 1
                events.append(IndexEvent(seq, IndexRemoved(tuple(tail[a:a + lay.event_blocks]))))
        return [events[i:i + lay.batch_events]
                for i in range(0, len(events), lay.batch_events)]

    def expected_after_evictions(self, chain: int) -> dict[str, int]:
        return {w: n // 2 for w, n in self.expected(chain).items() if n // 2}


def plan(entries: int, layout: Layout, seed: int = 0) -> Dataset:
    """A dataset of at least ``entries`` (block, worker) entries (whole chains)."""
    if layout.holders > layout.workers:
        raise ValueError("holders per chain cannot exceed the number of workers")
    rng = random.Random(seed)
    n = max(1, math.ceil(entries / layout.entries_per_chain))
    chains = [[rng.randbytes(32) for _ in range(layout.chain_blocks)] for _ in range(n)]
    holders = [[(c * layout.holders + j) % layout.workers for j in range(layout.holders)]
               for c in range(n)]
    ids = [f"worker-{i:03d}" for i in range(layout.workers)]
    return Dataset(layout, ids, chains, holders)
