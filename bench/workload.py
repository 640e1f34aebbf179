"""The one workload model of the benchmarks: tenants, system prompts, chats, sizes, a seed.

Every generator is deterministic in its ``WorkloadSpec`` (one seeded ``random.Random``): the
same spec always gives the same requests, in the same order. Token ids are bytes (0..255),
the tiny model's vocabulary. Each tenant has its own cache salt (``tenant-<i>``): tenants
never share KV, even for identical text. The generators give the shapes the benchmarks need:

- ``sessions(spec)`` (``kvmesh demo``): ``requests`` requests as sessions arriving open loop
  at ``rate_per_s`` sessions/s; a session's turns run in order, sessions run concurrently.
  A ``chat_fraction`` of sessions are chats (the tenant's system prompt, then up to
  ``turns_per_chat`` turns, each appending the previous answer and a new message); the rest
  are RAG (the tenant's template prefix, a popular document among ``docs_per_tenant``, one
  question).
- ``stream(spec)`` (``kvmesh bench e2e``): ``requests`` single requests, each one tenant's
  system prompt plus a fresh question, Poisson arrivals at ``rate_per_s`` requests/s; the
  tenant is uniform, or with ``hot_share`` > 0 ``tenant-0`` with that probability and else
  uniform over the others (skewed load).
- ``text_rounds(spec)`` (``kvmesh bench serve``): every tenant holds ``chats_per_tenant``
  chats over ``system_prompts`` app prompts shared by all tenants; round ``k`` holds turn
  ``k`` (of ``turns_per_chat``) of every chat in a seeded shuffled order, and each turn
  extends the chat's previous turn. Text is ASCII and ``token_ids == list(text.encode())``
  (a character per token): a text-based router (Ray's ``PrefixCacheAffinityRouter``) and a
  token-based one see the same prefixes.

``ceiling_tokens(rounds, block_size)`` scores rounds against a perfect router.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from deploy.ray.request import ServeRequest

_WORDS = ("the", "cache", "model", "token", "prefix", "tenant", "query", "answer", "node",
          "replica", "block", "route", "index", "latency", "batch", "prompt", "policy",
          "memory", "vector", "search", "report", "order", "invoice", "account", "status")


@dataclass(frozen=True)
class WorkloadSpec:
    """Sizes (in tokens; characters in text) and shape; each generator reads what it names.

    The defaults are the demo's; the e2e and Ray benches keep their own presets.
    """

    tenants: int = 6
    system_tokens: int = 1024     # a system prompt (the RAG template is half of it)
    question_tokens: int = 48     # a user message
    answer_tokens: int = 64       # text_rounds: an answer joining the chat's history
    max_tokens: int = 12          # tokens to generate per request
    requests: int = 120           # sessions, stream
    rate_per_s: float = 6.0       # arrivals/s: sessions (sessions), requests (stream)
    chat_fraction: float = 0.6    # sessions
    turns_per_chat: int = 6       # sessions, text_rounds
    doc_tokens: int = 512         # sessions (RAG documents)
    docs_per_tenant: int = 3      # sessions
    system_prompts: int = 2       # text_rounds: app prompts shared by every tenant
    chats_per_tenant: int = 3     # text_rounds
    hot_share: float = 0.0        # stream: tenant-0's share of the requests (0: uniform)
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.hot_share <= 1.0:
            raise ValueError(f"hot_share must be in [0, 1], got {self.hot_share}")


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
class Request:
    """One open-loop request: sent at ``arrival_s`` whether or not earlier ones finished."""

    arrival_s: float
    salt: str
    tokens: list[int]
    max_tokens: int


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(256) for _ in range(n)]


def sessions(spec: WorkloadSpec) -> list[Session]:
    """Sessions whose turns add up to ``spec.requests`` requests, in arrival order."""
    rng = random.Random(spec.seed)
    tenants = [f"tenant-{i}" for i in range(spec.tenants)]
    system = {t: _tokens(rng, spec.system_tokens) for t in tenants}
    template = {t: _tokens(rng, spec.system_tokens // 2) for t in tenants}
    docs = {t: [_tokens(rng, spec.doc_tokens) for _ in range(spec.docs_per_tenant)]
            for t in tenants}
    out: list[Session] = []
    clock = 0.0
    made = 0
    while made < spec.requests:
        tenant = rng.choice(tenants)
        clock += rng.expovariate(spec.rate_per_s)
        if rng.random() < spec.chat_fraction:
            n = min(spec.turns_per_chat, spec.requests - made)
            turns = [Turn(_tokens(rng, spec.question_tokens), spec.max_tokens)
                     for _ in range(n)]
            out.append(Session(tenant, tenant, clock, system[tenant], turns, chat=True))
        else:
            doc = docs[tenant][min(int(rng.expovariate(1.0)), spec.docs_per_tenant - 1)]
            turns = [Turn(_tokens(rng, spec.question_tokens), spec.max_tokens)]
            out.append(Session(tenant, tenant, clock, template[tenant] + doc, turns))
            n = 1
        made += n
    return out


def stream(spec: WorkloadSpec) -> list[Request]:
    """``spec.requests`` requests, the first at time 0, each a system prompt + question.

    With ``hot_share`` 0 the rng draws exactly what it drew before the field existed, so
    a seed gives the same requests as in earlier results."""
    rng = random.Random(spec.seed)
    systems = [_tokens(rng, spec.system_tokens) for _ in range(spec.tenants)]
    out, clock = [], 0.0
    for _ in range(spec.requests):
        t = _tenant(rng, spec.tenants, spec.hot_share)
        question = _tokens(rng, spec.question_tokens)
        out.append(Request(clock, f"tenant-{t}", systems[t] + question, spec.max_tokens))
        clock += rng.expovariate(spec.rate_per_s)
    return out


def _tenant(rng: random.Random, tenants: int, hot_share: float) -> int:
    """The index of a request's tenant: uniform, or 0 with probability ``hot_share`` and
    uniform over the others otherwise (one tenant: always 0)."""
    if not hot_share:
        return rng.randrange(tenants)  # the draw of the uniform stream, unchanged
    if tenants == 1 or rng.random() < hot_share:
        return 0
    return 1 + rng.randrange(tenants - 1)


def _text(rng: random.Random, chars: int) -> str:
    words: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(_WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:chars]


def text_rounds(spec: WorkloadSpec) -> list[list[ServeRequest]]:
    """Round k = turn k of every chat (see the module docstring)."""
    rng = random.Random(spec.seed)
    systems = [f"System: you are assistant {i} of the app. " + _text(rng, spec.system_tokens)
               for i in range(spec.system_prompts)]
    chats = []  # (salt, history text)
    for t in range(spec.tenants):
        for c in range(spec.chats_per_tenant):
            system = systems[(t + c) % spec.system_prompts]
            chats.append([f"tenant-{t}", system])
    rounds = []
    for _ in range(spec.turns_per_chat):
        batch = []
        for chat in chats:
            chat[1] += "\nUser: " + _text(rng, spec.question_tokens) + "\nAssistant:"
            text = chat[1]
            batch.append(ServeRequest(token_ids=list(text.encode()), salt=chat[0],
                                      max_tokens=spec.max_tokens, prompt=text))
            chat[1] += " " + _text(rng, spec.answer_tokens)
        rng.shuffle(batch)
        rounds.append(batch)
    return rounds


def ceiling_tokens(rounds: list[list[ServeRequest]], block_size: int) -> int:
    """Tokens a perfect router with unbounded caches could serve from cache: per request,
    the longest block-aligned prefix (at most ``len - 1`` tokens) shared with any request of
    the same salt sent before it, in order."""
    seen: dict[str | None, list[list[int]]] = {}
    total = 0
    for batch in rounds:
        for req in batch:
            best = 0
            for other in seen.get(req.salt, []):
                n = 0
                for a, b in zip(req.token_ids, other, strict=False):
                    if a != b:
                        break
                    n += 1
                best = max(best, n)
            best = min(best, len(req.token_ids) - 1)
            total += best // block_size * block_size
            seen.setdefault(req.salt, []).append(req.token_ids)
    return total
