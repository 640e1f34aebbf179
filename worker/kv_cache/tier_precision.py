"""The index's precision per tier: how much of what it promised on each tier the worker had.

A promised token is *kept* when the worker served a token from that tier or a faster one
(gpu < cpu < disk). Promises are capped at the prompt's length and matched to served tokens
by counts, fastest tier first: exact when both chains are ordered by tier.

See docs/architecture.md#worker-kv-cache.
"""
from __future__ import annotations

from collections.abc import Mapping

from kvmesh.contract import TIERS

TIER_ORDER = TIERS  # fastest first


def missed_by_tier(promised: Mapping[str, int], served: Mapping[str, int]) -> dict[str, int]:
    """Tokens of each tier's promise the worker did not serve from that tier or a faster one
    (see the module docstring). Keys: the tiers with a promise; unknown tiers are ignored."""
    left = {t: max(int(served.get(t, 0)), 0) for t in TIER_ORDER}
    missed: dict[str, int] = {}
    for rank, tier in enumerate(TIER_ORDER):
        want = max(int(promised.get(tier, 0)), 0)
        if not want:
            continue
        for faster in reversed(TIER_ORDER[:rank + 1]):  # its own tier first, then faster
            take = min(want, left[faster])
            left[faster] -= take
            want -= take
        missed[tier] = want
    return missed


class TierPrecision:
    """Cumulative promised and missed tokens per tier (``TierStats.index_promised_tokens`` /
    ``index_missed_tokens``). Invariant: ``missed[t] <= promised[t]`` for every tier."""

    def __init__(self) -> None:
        self.promised = dict.fromkeys(TIER_ORDER, 0)
        self.missed = dict.fromkeys(TIER_ORDER, 0)

    def add(self, promised: Mapping[str, int], served: Mapping[str, int],
            prompt_tokens: int) -> None:
        """One finished request: the index's promise, what the worker served, and the
        prompt's length (each tier's promise is capped at it)."""
        capped = {t: min(max(int(n), 0), prompt_tokens) for t, n in promised.items()}
        for tier, n in missed_by_tier(capped, served).items():
            self.promised[tier] += capped[tier]
            self.missed[tier] += n
