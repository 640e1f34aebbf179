"""The one interface every routing policy implements, and what a policy sees.

``Policy.rank(prompt_tokens, workers, rng, key=b"") -> list[Ranked]``: every policy returns
EVERY worker it was given (callers fail over down the list), best first, each with a
``cost`` (lower is better; its unit depends on the policy) and the matched tokens it
credited. Ties are broken with ``rng`` so that a miss never lands on the same replica every
time. ``key`` is a digest of the prompt's salt, LoRA and first tokens (``service.route_steps.
prefix_key``); only a policy with ``reads_key`` set (``consistent_hash``) reads it, and
callers compute it for those only (the others get ``b""``). Policies are pure apart from
counters and caches (``round_robin``'s position, ``consistent_hash``'s rings); the service
keeps one instance per replica.
"""
from __future__ import annotations

import abc
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from service.index.base import BlockMatch, WorkerLoad

if TYPE_CHECKING:
    from service.policy.fetch import FetchChoice


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What a policy sees of one live worker for one request."""

    worker_id: str
    address: str = ""
    load: WorkerLoad = field(default_factory=WorkerLoad)
    match: BlockMatch = field(default_factory=BlockMatch)
    block_size: int = 16
    ns: str = ""

    @property
    def matched_tokens(self) -> int:
        return self.match.blocks * self.block_size

    @property
    def matched_tokens_by_tier(self) -> dict[str, int]:
        """``matched_tokens`` split by the tier holding each block."""
        m, bs = self.match, self.block_size
        return {"gpu": m.gpu * bs, "cpu": m.cpu * bs, "disk": m.disk * bs}


@dataclass(frozen=True, slots=True)
class Ranked:
    view: WorkerView
    cost: float
    matched_tokens: int
    fetch: FetchChoice | None = None  # run on ``view`` after this peer fetch (kvmesh policy)


class Policy(abc.ABC):
    """Ranks workers for one request; see the module docstring for the contract."""

    name: ClassVar[str]
    reads_key: ClassVar[bool] = False  # whether ``rank`` reads ``key`` (callers skip it if not)

    @abc.abstractmethod
    def rank(self, prompt_tokens: int, workers: Sequence[WorkerView],
             rng: random.Random, key: bytes = b"") -> list[Ranked]:
        """All of ``workers``, best first."""
