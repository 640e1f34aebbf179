"""kvmesh index events in their wire form (``index_pb2``), built from block-level changes.

The bridge's vLLM -> index boundary: ``engine_state`` reads vLLM's structs
(``kvmesh.events.vllm``) into block changes and this builds the index's events from them, as
messages or as ``kvmesh.events.wire`` bytes (the same events).

Tiers are positions in ``PB_TIERS`` (0 gpu, 1 cpu, 2 disk). A chain's first block has parent
``b""``, as ``PublishEvents`` and ``SyncWorker`` expect.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from kvmesh.contract import TIER_PB, TIERS
from kvmesh.events.wire import Wire
from kvmesh.v1 import index_pb2

PB_TIERS = tuple(TIER_PB[t] for t in TIERS)
# Hashes in one index event: a PublishEvents batch may carry at most the service's
# --max-batch-hashes (8192 by default) and an event is never split across batches.
MAX_RUN = 1024


class IndexEvents:
    """Index events being built, numbered by ``next_seq``: consecutive chain blocks of one
    tier share one message (``stored`` of a block whose parent is the run's last block extends
    the run; ``removed`` of one tier extends a removal run), up to ``MAX_RUN`` hashes.
    ``flush()`` ends the last run. ``wire=True``: each event a ``kvmesh.events.wire.Wire`` (the
    same event, already as the link sends it) instead of a message."""

    def __init__(self, next_seq: Callable[[], int], wire: bool = False) -> None:
        self.next_seq = next_seq
        self.wire = wire
        self.events: list[index_pb2.KvEvent | Wire] = []
        self.kind = ""
        self.tier = -1
        self.parent = b""
        self.hashes: list[bytes] = []

    def stored(self, chain: bytes, parent: bytes, tier: int) -> None:
        if not (self.kind == "stored" and self.tier == tier and self.hashes[-1] == parent
                and len(self.hashes) < MAX_RUN):
            self.flush()
            self.kind, self.tier, self.parent = "stored", tier, parent
        self.hashes.append(chain)

    def removed(self, chain: bytes, tier: int) -> None:
        if not (self.kind == "removed" and self.tier == tier and len(self.hashes) < MAX_RUN):
            self.flush()
            self.kind, self.tier = "removed", tier
        self.hashes.append(chain)

    def stored_run(self, chains: Sequence[bytes], parent: bytes, tier: int) -> None:
        """``stored`` of each of ``chains`` in order, each the parent of the next: the same
        events, a slice at a time."""
        i, n = 0, len(chains)
        while i < n:
            if not (self.kind == "stored" and self.tier == tier and self.hashes[-1] == parent
                    and len(self.hashes) < MAX_RUN):
                self.flush()
                self.kind, self.tier, self.parent = "stored", tier, parent
            part = chains[i:i + MAX_RUN - len(self.hashes)]
            self.hashes.extend(part)
            i += len(part)
            parent = part[-1]

    def removed_run(self, chains: Sequence[bytes], tier: int) -> None:
        """``removed`` of each of ``chains`` in order: the same events, a slice at a time."""
        i, n = 0, len(chains)
        while i < n:
            if not (self.kind == "removed" and self.tier == tier and len(self.hashes) < MAX_RUN):
                self.flush()
                self.kind, self.tier = "removed", tier
            part = chains[i:i + MAX_RUN - len(self.hashes)]
            self.hashes.extend(part)
            i += len(part)

    def cleared(self) -> None:
        self.flush()
        seq = self.next_seq()
        self.events.append(Wire.cleared(seq) if self.wire else
                           index_pb2.KvEvent(seq=seq, cleared=index_pb2.AllBlocksCleared()))

    def flush(self) -> None:
        if not self.hashes:
            return
        seq, tier = self.next_seq(), PB_TIERS[self.tier]
        if self.wire:
            self.events.append(Wire.stored(seq, self.hashes, self.parent, tier)
                               if self.kind == "stored" else
                               Wire.removed(seq, self.hashes, tier))
            self.kind, self.hashes = "", []
            return
        # a dict builds the sub-message in place (a message argument would be copied)
        if self.kind == "stored":
            ev = index_pb2.KvEvent(seq=seq, stored={
                "block_hashes": self.hashes, "parent_hash": self.parent, "tier": tier})
        else:
            ev = index_pb2.KvEvent(seq=seq, removed={"block_hashes": self.hashes,
                                                     "tier": tier})
        self.events.append(ev)
        self.kind, self.hashes = "", []


def snapshot_runs(blocks: Iterable[tuple[bytes, bytes, Sequence[int]]]
                  ) -> list[index_pb2.BlockStored]:
    """``(chain, parent, held per tier)`` as ``SyncWorker`` blocks: per tier, in the given
    order, runs of consecutive chain blocks (a block whose parent is the previous one's hash
    extends the run)."""
    blocks = list(blocks)
    out: list[index_pb2.BlockStored] = []
    for t, pb_tier in enumerate(PB_TIERS):
        run: index_pb2.BlockStored | None = None
        for chain, parent, held in blocks:
            if not held[t]:
                continue
            if run is None or run.block_hashes[-1] != parent:
                run = index_pb2.BlockStored(parent_hash=parent, tier=pb_tier)
                out.append(run)
            run.block_hashes.append(chain)
    return out
