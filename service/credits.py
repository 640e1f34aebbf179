"""What a lower-tier cache match is worth on one worker: the share of recomputing it that
onboarding saves.

A block found on the worker's CPU or disk tier must be copied back to the device before the
prefill that reads it; recomputing it instead costs ``block_size`` prefill tokens. So::

    credit(tier) = clamp(1 - onboard_us_per_block[tier] / (block_size * prefill_us_per_token),
                         0, 1)

from the costs the worker measures and reports with its load (``WorkerLoad``). A worker
whose copies are as slow as recomputing earns nothing for the match; one whose copies are
free earns as much as for a GPU-tier match (credit 1).

Precedence, per tier: an explicit credit in :class:`service.config.CostWeights` (the
operator's ``--cpu-credit`` / ``--disk-credit``) is used for every worker; otherwise the
worker's measurement, when it has measured both costs; otherwise the configured fallback
(a worker that has not measured yet, or an older worker that never does).
"""
from __future__ import annotations

from typing import NamedTuple

from service.config import CostWeights
from service.index.base import WorkerLoad


class TierCredits(NamedTuple):
    """Fraction of a matched block's tokens credited per lower tier (GPU is always 1)."""

    cpu: float
    disk: float


def measured_credit(onboard_us_per_block: float, prefill_us_per_token: float,
                    block_size: int) -> float | None:
    """The credit the measurement gives, in [0, 1]; ``None`` when either cost is unknown
    (0.0, the wire's "not measured") or the block size is not positive."""
    if onboard_us_per_block <= 0.0 or prefill_us_per_token <= 0.0 or block_size <= 0:
        return None
    saved = 1.0 - onboard_us_per_block / (block_size * prefill_us_per_token)
    return min(max(saved, 0.0), 1.0)


def _credit(explicit: float | None, onboard_us: float, load: WorkerLoad, block_size: int,
            fallback: float) -> float:
    if explicit is not None:
        return explicit
    measured = measured_credit(onboard_us, load.prefill_us_per_token, block_size)
    return fallback if measured is None else measured


def tier_credits(weights: CostWeights, load: WorkerLoad, block_size: int) -> TierCredits:
    """The CPU and disk credits of one worker (see the module docstring for precedence)."""
    return TierCredits(
        _credit(weights.cpu_credit, load.onboard_us_per_block_cpu, load, block_size,
                weights.cpu_credit_fallback),
        _credit(weights.disk_credit, load.onboard_us_per_block_disk, load, block_size,
                weights.disk_credit_fallback))
