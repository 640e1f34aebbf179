"""A request inside the engine: its KV view, sampling parameters, output and timing."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from worker.kv_cache import TIER_NAMES, KVRequest


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


SAMPLING_EPS = 1e-5  # a temperature below this is greedy (as in vLLM): dividing the logits
# by a denormal one overflows them to inf, and the softmax of those is NaN


@dataclass(frozen=True)
class SamplingParams:
    """``temperature < SAMPLING_EPS`` (0 included) is greedy (deterministic); ``seed`` makes
    sampling reproducible."""

    max_tokens: int = 16
    temperature: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False

    @property
    def sampled(self) -> bool:
        """Whether the next token is drawn (else: the argmax)."""
        return self.temperature >= SAMPLING_EPS


@dataclass(eq=False)
class Seq:
    """One request. ``req.token_ids`` is the prompt followed by the generated tokens.

    ``num_cached_tokens`` is fixed at first admission (what the prefix cache saved this
    request); a re-admission after preemption does not change it.
    """

    req: KVRequest
    params: SamplingParams
    num_prompt_tokens: int
    status: SeqStatus = SeqStatus.WAITING
    num_cached_tokens: int = -1  # -1 until first admitted
    cached_tokens_by_tier: dict[str, int] = field(  # fixed with it: gpu, cpu, disk (+ peer)
        default_factory=lambda: dict.fromkeys(TIER_NAMES, 0))
    expected_cached: int = 0     # the cache hit it would get at enqueue time (load report)
    finish_reason: str | None = None
    arrival: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    finished_at: float | None = None
    generator: torch.Generator | None = None

    @property
    def seq_id(self) -> str:
        return self.req.request_id

    @property
    def num_tokens(self) -> int:
        return len(self.req.token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.req.token_ids[self.num_prompt_tokens:]

    @property
    def num_uncomputed(self) -> int:
        """Tokens whose KV is not in the cache yet (the prompt's rest, or the last sample)."""
        return self.num_tokens - self.req.num_computed_tokens

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.arrival
