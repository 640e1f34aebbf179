"""Realistic prefix-sharing workloads: tenants, system prompts, RAG templates, chats.

A workload is a list of *sessions*; each session is a list of turns that must run in order
(a chat's next turn carries the whole history plus the last answer). Sessions start at
their own arrival time and run concurrently. Token ids are bytes (0..255), the tiny model's
vocabulary, drawn from seeded generators: the same seed always gives the same workload.

- Several tenants, each with its own cache salt and its own long system prompt.
- RAG: a tenant's fixed template prefix, then a document drawn from a shared pool (popular
  documents repeat), then a short question.
- Chats: system prompt + turns; each turn appends the previous answer and a new message.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Turn:
    new_tokens: list[int]          # appended to the session's history before this turn
    max_tokens: int


@dataclass
class Session:
    tenant: str
    salt: str
    arrival_s: float
    prefix: list[int]              # shared part (system prompt / template + document)
    turns: list[Turn] = field(default_factory=list)
    chat: bool = False             # whether answers join the history


@dataclass(frozen=True)
class WorkloadSpec:
    requests: int = 120
    tenants: int = 6
    system_tokens: int = 1024
    doc_tokens: int = 512
    docs_per_tenant: int = 3
    question_tokens: int = 48
    chat_fraction: float = 0.6
    turns_per_chat: int = 6
    max_tokens: int = 12
    rate_per_s: float = 6.0        # session arrivals per second (open loop)
    seed: int = 0


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(256) for _ in range(n)]


def build(spec: WorkloadSpec) -> list[Session]:
    """Sessions whose turns add up to ``spec.requests`` requests."""
    rng = random.Random(spec.seed)
    tenants = [f"tenant-{i}" for i in range(spec.tenants)]
    system = {t: _tokens(rng, spec.system_tokens) for t in tenants}
    template = {t: _tokens(rng, spec.system_tokens // 2) for t in tenants}
    docs = {t: [_tokens(rng, spec.doc_tokens) for _ in range(spec.docs_per_tenant)]
            for t in tenants}
    sessions: list[Session] = []
    clock = 0.0
    made = 0
    while made < spec.requests:
        tenant = rng.choice(tenants)
        clock += rng.expovariate(spec.rate_per_s)
        if rng.random() < spec.chat_fraction:
            n = min(spec.turns_per_chat, spec.requests - made)
            turns = [Turn(_tokens(rng, spec.question_tokens), spec.max_tokens)
                     for _ in range(n)]
            sessions.append(Session(tenant, tenant, clock, system[tenant], turns, chat=True))
        else:
            doc = docs[tenant][min(int(rng.expovariate(1.0)), spec.docs_per_tenant - 1)]
            turns = [Turn(_tokens(rng, spec.question_tokens), spec.max_tokens)]
            sessions.append(Session(tenant, tenant, clock, template[tenant] + doc, turns))
            n = 1
        made += n
    return sessions
