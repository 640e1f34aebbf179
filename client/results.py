"""What the kvmesh client returns: plain dataclasses, free of protobuf types.

``RouteResult`` is the service's routing decision (best candidate first, plus the ranked
alternatives a caller can fail over to); ``GenerateResult`` is a whole completed generation,
never a partial one; ``TokenChunk`` is what ``generate_stream`` hands on as tokens arrive;
``PinResult`` is what each worker did with a pin (or unpin).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass(frozen=True)
class FetchPlan:
    """Blocks a candidate pulls from a peer before it prefills (``index.proto``'s
    ``FetchPlan``): chain blocks ``[start_block, start_block + len(block_hashes))`` from
    ``source_worker_id`` at ``source_address``, ``tokens`` of prompt, in about ``est_s``
    seconds. ``ticket`` is the service's grant, opaque here: only that candidate can use it.
    """

    source_worker_id: str
    source_address: str
    start_block: int
    block_hashes: tuple[bytes, ...]
    tokens: int
    est_s: float
    ticket: bytes = b""

    @property
    def blocks(self) -> int:
        return len(self.block_hashes)


@dataclass(frozen=True)
class Candidate:
    """One worker the service ranked for a request; lower ``cost`` is better.

    ``matched_tokens_by_tier``: ``matched_tokens`` split by the tier each matched block is
    held on (``gpu``, ``cpu``, ``disk``); ``tier`` is the slowest of them. ``fetch``: set
    when this worker should first pull blocks from a peer (``matched_tokens`` then counts
    them); the clients pass it on in ``GenerateRequest.fetch`` when they call this worker.
    """

    worker_id: str
    address: str
    matched_tokens: int
    cost: float
    tier: str = "TIER_UNSPECIFIED"
    load: dict[str, int | float] = field(default_factory=dict)
    matched_tokens_by_tier: dict[str, int] = field(default_factory=dict)
    fetch: FetchPlan | None = None


@dataclass(frozen=True)
class RouteResult:
    """The chosen worker (``candidates[0]``) and the full ranking.

    ``matched_tokens`` is how much of the prompt the index says the chosen worker has cached
    (``matched_tokens_by_tier``: split by tier); ``degraded`` is true when the index was
    unreachable and the answer is load-only.
    """

    worker_id: str
    address: str
    matched_tokens: int
    candidates: list[Candidate]
    degraded: bool = False
    prompt_tokens: int = 0
    policy: str = ""
    matched_tokens_by_tier: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class GenerateResult:
    """A finished generation on one worker.

    ``num_cached_tokens`` is what the worker really served from its prefix cache
    (``cached_tokens_by_tier``: split by the tier the blocks came from, ``gpu``/``cpu``/
    ``disk``, and ``peer`` for blocks pulled from another worker for this request; empty
    from a worker that predates tiers) and ``ttft_s`` its measured time to
    first token; ``matched_tokens`` is what the index promised for that worker when routing;
    ``attempts`` counts workers tried (1 = no failover).
    """

    worker_id: str
    token_ids: list[int]
    num_cached_tokens: int
    ttft_s: float
    finish_reason: str
    prompt_tokens: int
    address: str = ""
    e2e_s: float = 0.0
    matched_tokens: int = 0
    attempts: int = 1
    cached_tokens_by_tier: dict[str, int] = field(default_factory=dict)


class TokenChunk(NamedTuple):
    """Tokens streamed by ``generate_stream`` and the worker producing them."""

    token_ids: list[int]
    worker_id: str
    address: str


@dataclass(frozen=True)
class PinnedWorker:
    """One worker's part of a pin: the blocks it pinned (unpinned), or why it could not.
    A pin also says of how many (``chain_blocks``, the worker's block size) and whether the
    worker's pin cap cut it short (``cap_reached``)."""

    worker_id: str
    pinned_blocks: int
    error: str = ""
    chain_blocks: int = 0
    cap_reached: bool = False


@dataclass(frozen=True)
class PinResult:
    """The answer to ``pin`` / ``unpin``: the prefix's full blocks (``chain_blocks``, 0 for
    an unpin) and one entry per worker the service called."""

    chain_blocks: int
    workers: list[PinnedWorker]

    @property
    def failed(self) -> list[PinnedWorker]:
        """The workers that could not be reached or refused."""
        return [w for w in self.workers if w.error]

    @property
    def capped(self) -> list[PinnedWorker]:
        """The workers that pinned only part of the prefix: their pin cap is full."""
        return [w for w in self.workers if w.cap_reached and not w.error]
