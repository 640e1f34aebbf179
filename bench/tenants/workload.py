"""The load of ``kvmesh bench tenants``: well-behaved tenants and one that floods.

``victims`` tenants each send requests made of their own system prompt (``system_tokens``,
the same every time) and a short unique question (``question_tokens``), at Poisson arrivals
of ``victim_rate`` per second each: once their prompt is cached, nearly every prompt token
is a hit. The :data:`FLOOD` tenant sends long unique prompts (``flood_tokens``, nothing ever
shared) at Poisson arrivals of ``flood_rate`` per second: every one is a miss, and every
block it caches is one more block LRU may take from the others. All of them over the same
``duration_s``, interleaved by arrival time.

Pure and deterministic in :class:`TenantLoad`: the same load gives the same requests, and
the runs of one invocation send the very same ones (``no-flood`` leaves the flood's out).
Each tenant's salt is its name: salts isolate tenants exactly as in production, and the
driver adds the run's name to them so no run hits what an earlier one cached.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

FLOOD = "flood"
VICTIM_NAMES = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")


@dataclass(frozen=True)
class TenantLoad:
    """Sizes in tokens, rates in requests per second (per tenant), times in seconds."""

    victims: int = 3
    system_tokens: int = 768
    question_tokens: int = 32
    victim_rate: float = 0.25
    flood_tokens: int = 512
    flood_rate: float = 3.0
    duration_s: float = 60.0
    max_tokens: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.victims <= len(VICTIM_NAMES):
            raise ValueError(f"victims: 1 to {len(VICTIM_NAMES)}, not {self.victims}")
        if min(self.system_tokens, self.question_tokens, self.flood_tokens,
               self.max_tokens) < 1:
            raise ValueError("token counts must be at least 1")
        if self.victim_rate <= 0 or self.flood_rate <= 0 or self.duration_s <= 0:
            raise ValueError("rates and the duration must be positive")

    @property
    def victim_names(self) -> tuple[str, ...]:
        return VICTIM_NAMES[:self.victims]


@dataclass(frozen=True)
class TenantRequest:
    """One open-loop request: sent at ``arrival_s`` whether or not earlier ones finished."""

    arrival_s: float
    tenant: str
    salt: str
    tokens: tuple[int, ...]
    max_tokens: int

    @property
    def flood(self) -> bool:
        return self.tenant == FLOOD


def _tokens(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.randrange(256) for _ in range(n))  # the tiny model's vocabulary


def _arrivals(rng: random.Random, rate: float, duration_s: float) -> list[float]:
    """Poisson arrivals in [0, duration_s), the first at 0."""
    out, clock = [], 0.0
    while clock < duration_s:
        out.append(clock)
        clock += rng.expovariate(rate)
    return out


def requests(load: TenantLoad) -> list[TenantRequest]:
    """Every tenant's requests, flood included, in arrival order (ties: victims first)."""
    rng = random.Random(load.seed)
    out: list[TenantRequest] = []
    for name in load.victim_names:
        system = _tokens(rng, load.system_tokens)
        for t in _arrivals(rng, load.victim_rate, load.duration_s):
            out.append(TenantRequest(t, name, name,
                                     system + _tokens(rng, load.question_tokens),
                                     load.max_tokens))
    for t in _arrivals(rng, load.flood_rate, load.duration_s):
        out.append(TenantRequest(t, FLOOD, FLOOD, _tokens(rng, load.flood_tokens),
                                 load.max_tokens))
    out.sort(key=lambda r: (r.arrival_s, r.flood))
    return out
