"""Peer fetch: the option "worker W pulls the blocks beyond its own match from the holder H".

For a candidate W and the best holder H of the same namespace (the longest match, then the
least queued prefill), the option's cost is W's ordinary cost as if H's match were W's own,
on W's device (the pulled blocks land there), plus the transfer time in prefill-token units:
``prefill_weight * (fetch_us_per_call + n * fetch_us_per_block) / prefill_us_per_token``,
from W's measured receive costs (else :class:`FetchCosts`' defaults). The router keeps, per
worker, whichever of "recompute" and "fetch" is cheaper; H itself competes with no fetch, so
the route picks among run on H, run on W with a fetch and run on W recomputing. A fetch is
planned only for at least ``min_fetch_blocks`` blocks and only between workers that both
report ``peer_fetch``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from service.index.base import BlockMatch
from service.policy.base import WorkerView

# Until a worker has measured its fetches: ~1.2 ms per call (gRPC control call and the
# source's read) and the per-block time of 1 GB/s on a 2 MiB block (the 8-layer model's).
DEFAULT_US_PER_CALL = 1200.0
DEFAULT_US_PER_BLOCK = 2000.0
DEFAULT_PREFILL_US_PER_TOKEN = 200.0  # until the worker has measured its prefill


@dataclass(frozen=True, slots=True)
class FetchCosts:
    """The router's fetch settings (``--peer-fetch``, ``--min-fetch-blocks``)."""

    enabled: bool = False
    min_fetch_blocks: int = 4
    us_per_call: float = DEFAULT_US_PER_CALL
    us_per_block: float = DEFAULT_US_PER_BLOCK

    def __post_init__(self) -> None:
        if self.min_fetch_blocks < 1:
            raise ValueError("min_fetch_blocks must be >= 1")
        if not (self.us_per_call >= 0 and self.us_per_block >= 0):
            raise ValueError("fetch costs must be >= 0")


@dataclass(frozen=True, slots=True)
class FetchChoice:
    """Pull blocks ``[start_block, start_block + blocks)`` of the chain from ``source``."""

    source: WorkerView
    start_block: int
    blocks: int
    est_s: float


def holder(views: Sequence[WorkerView]) -> WorkerView | None:
    """The best source among ``views`` that serve peers: the longest match, then the least
    queued prefill (its read competes with its own steps); ``None`` if none matched."""
    best = None
    for v in views:
        if not v.load.peer_fetch or not v.match.blocks:
            continue
        if best is None or (v.match.blocks, -v.load.queued_prefill_tokens) > (
                best.match.blocks, -best.load.queued_prefill_tokens):
            best = v
    return best


def plan(v: WorkerView, source: WorkerView | None, costs: FetchCosts) -> FetchChoice | None:
    """The fetch ``v`` would make from ``source``, or ``None`` when not worth planning (off,
    another namespace, fewer than ``min_fetch_blocks`` blocks beyond ``v``'s match)."""
    if (not costs.enabled or source is None or source.worker_id == v.worker_id
            or not v.load.peer_fetch or source.ns != v.ns
            or source.block_size != v.block_size):
        return None
    n = source.match.blocks - v.match.blocks
    if n < costs.min_fetch_blocks:
        return None
    load = v.load
    per_call = load.fetch_us_per_call or costs.us_per_call
    per_block = load.fetch_us_per_block or costs.us_per_block
    return FetchChoice(source, v.match.blocks, n, (per_call + n * per_block) / 1e6)


def fetched_view(v: WorkerView, choice: FetchChoice) -> WorkerView:
    """``v`` as it would be once the fetch landed: the pulled blocks on its device."""
    m = v.match
    return replace(v, match=BlockMatch(m.blocks + choice.blocks, m.gpu + choice.blocks,
                                       m.cpu, m.disk))


def transfer_tokens(v: WorkerView, choice: FetchChoice) -> float:
    """The fetch's time in ``v``'s prefill-token units."""
    us = v.load.prefill_us_per_token or DEFAULT_PREFILL_US_PER_TOKEN
    return choice.est_s * 1e6 / us
