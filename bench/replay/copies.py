"""What a simulated worker's copies between tiers cost and moved (``kvmesh bench tiers``).

The manager orders the copies (``KVCacheManager.take_transfers()``: ``Offload`` device ->
CPU, ``Spill`` CPU -> disk, ``Onboard`` CPU/disk -> device, ``Drop`` a disk file to delete,
which costs the step nothing: the data plane deletes it in the background); a real engine
executes them,
the simulation prices them with :class:`~bench.replay.cluster.CostModel` and counts them
here. Nothing is copied; the counts are what the real manager ordered.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from worker.kv_cache.transfers import Drop, Offload, Onboard, Spill

if TYPE_CHECKING:  # cluster imports this module
    from .cluster import CostModel


@dataclass
class CopyTotals:
    """Blocks moved between tiers (cumulative) and the seconds the copies took.

    ``onboard_blocks`` is keyed by the tier the blocks came from ("cpu", "disk");
    ``onboard_wait_s`` sums the time admitted requests waited for their onboard.
    """

    onboard_blocks: dict[str, int] = field(default_factory=dict)
    offload_blocks: int = 0
    spill_blocks: int = 0
    copy_s: float = 0.0
    onboard_wait_s: float = 0.0

    def charge(self, transfers: Iterable[Offload | Spill | Onboard | Drop], cost: CostModel,
               block_size: int) -> float:
        """Count ``transfers`` and return the seconds they take one after the other."""
        seconds = 0.0
        for t in transfers:
            if isinstance(t, Offload):
                self.offload_blocks += 1
                seconds += cost.offload_s(block_size)
            elif isinstance(t, Spill):
                self.spill_blocks += 1
                seconds += cost.spill_s(block_size)
            elif isinstance(t, Onboard):
                for tier, _, _ in t.copies:
                    self.onboard_blocks[tier] = self.onboard_blocks.get(tier, 0) + 1
                    seconds += cost.onboard_s(tier, block_size)
        self.copy_s += seconds
        return seconds

    def add(self, other: CopyTotals) -> None:
        """Fold ``other`` into this one (the cluster's totals from its workers')."""
        for tier, n in other.onboard_blocks.items():
            self.onboard_blocks[tier] = self.onboard_blocks.get(tier, 0) + n
        self.offload_blocks += other.offload_blocks
        self.spill_blocks += other.spill_blocks
        self.copy_s += other.copy_s
        self.onboard_wait_s += other.onboard_wait_s


def offloads_s(transfers: Iterable[Offload | Spill | Onboard | Drop], cost: CostModel,
               block_size: int) -> tuple[float, int]:
    """The seconds of the ``Offload`` orders among ``transfers`` and how many onboard copies
    they hold (what a write-behind data plane takes off the step's path)."""
    offloads = onboards = 0
    for t in transfers:
        if isinstance(t, Offload):
            offloads += 1
        elif isinstance(t, Onboard):
            onboards += len(t.copies)
    return offloads * cost.offload_s(block_size), onboards
