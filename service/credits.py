"""What a lower-tier cache match is worth on one worker: the share of recomputing it that
onboarding saves.

``credit(tier) = clamp(1 - onboard_us_per_block / (block_size * prefill_us_per_token), 0, 1)``
from the worker's measured costs. Precedence per tier: the operator's explicit credit, else
the worker's measurement, else the configured fallback.

See docs/architecture.md#the-cost-model-servicepolicycostpy.
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
