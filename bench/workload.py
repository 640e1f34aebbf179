"""The one workload model of the benchmarks: tenants, system prompts, chats, sizes, a seed.

Every generator is deterministic in its ``WorkloadSpec``: the same spec gives the same
requests in the same order. Token ids are bytes (the tiny model's vocabulary); each tenant has
its own cache salt. ``sessions`` (the demo), ``stream`` and ``chats`` (bench e2e),
``text_rounds`` (bench serve), ``chat_trace`` (a Mooncake-format trace); ``ceiling_tokens``
scores a perfect router.

See docs/architecture.md#replay-and-simulation.
"""
from __future__ import annotations

import math
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
    answer_tokens: int = 64       # text_rounds, chats: an answer joining the chat's history
    max_tokens: int = 12          # tokens to generate per request
    requests: int = 120           # sessions, stream
    rate_per_s: float = 6.0       # arrivals/s: sessions (sessions), requests (stream)
    chat_fraction: float = 0.6    # sessions
    turns_per_chat: int = 6       # sessions, text_rounds, chats
    doc_tokens: int = 512         # sessions (RAG documents)
    docs_per_tenant: int = 3      # sessions
    system_prompts: int = 2       # text_rounds: app prompts shared by every tenant
    chats_per_tenant: int = 3     # text_rounds, chats
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


def chats(spec: WorkloadSpec) -> list[Request]:
    """Long multi-turn chats whose holders overload (``kvmesh bench e2e --workload chats``).

    ``spec.tenants`` tenants, each with a ``system_tokens`` system prompt and
    ``chats_per_tenant`` chats of ``turns_per_chat`` turns. Turn k of a chat is its system
    prompt, the k earlier questions each followed by its answer (``answer_tokens`` of
    seeded tokens: the stream never depends on what a run generated, so every row sends
    the same prompts), then the new question. Turns go out round by round (every chat's
    turn 0, then every chat's turn 1, ...), the chats in a new seeded order each round (in
    one fixed order, request i of a round would be chat i again, and round robin over W
    workers dividing the chat count would keep every chat on one worker by coincidence),
    at Poisson arrivals of ``rate_per_s``: each
    chat grows turn after turn, and every chat of a tenant shares its system prompt, so a
    router that keeps each tenant on the worker holding its prompt makes that worker busy
    while others idle (fewer tenants than workers: some workers hold nothing).
    ``spec.requests`` caps the stream (0 or more than all turns: all of them)."""
    rng = random.Random(spec.seed)
    systems = [_tokens(rng, spec.system_tokens) for _ in range(spec.tenants)]
    convos = [(t, [(_tokens(rng, spec.question_tokens), _tokens(rng, spec.answer_tokens))
                   for _ in range(spec.turns_per_chat)])
              for t in range(spec.tenants) for _ in range(spec.chats_per_tenant)]
    total = len(convos) * spec.turns_per_chat
    limit = min(spec.requests, total) if spec.requests > 0 else total
    out, clock = [], 0.0
    for k in range(spec.turns_per_chat):
        for t, turns in rng.sample(convos, len(convos)):
            if len(out) == limit:
                return out
            history = [tok for q, a in turns[:k] for tok in q + a]
            out.append(Request(clock, f"tenant-{t}", systems[t] + history + turns[k][0],
                               spec.max_tokens))
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


# --- the multi-tenant chat trace (Mooncake format) ---------------------------------------

CHUNK = 512  # tokens a Mooncake hash id names (bench.replay.trace.CHUNK_TOKENS)


@dataclass(frozen=True)
class ChatTraceSpec:
    """A multi-tenant chat service; ranges are inclusive ``(low, high)``, drawn log-uniform
    (many short ones, a few long ones) except counts, drawn uniform.

    Each tenant (cache salt ``tenant-<i>``) has ``system_prompts`` system prompts of
    ``system_chunks`` chunks of 512 tokens; its chats share them. Sessions start open loop
    (Poisson, ``session_rate_per_s``) at a tenant drawn with Zipf weights ``1 / rank**zipf``
    and use one of its prompts. A session is ``turns`` turns; turn ``k``'s prompt is the
    system prompt, the whole history (every earlier user message and answer), then a new user
    message of ``user_tokens``; its answer of ``answer_tokens`` joins the history. The next
    turn arrives once the answer has streamed (``answer_s_per_token``) and the user has
    thought for ``think_s`` seconds.

    The defaults (about 4,900 requests over 6 minutes, 13 a second) saturate ``kvmesh bench
    replay --workers 8 --capacity-blocks 2000`` (256K pooled tokens): busy about 2/3 of the
    time, a working set of 1.65M tokens (6.5x the pool, most of it live at once: sessions
    last minutes), and running requests often leave a worker short of free blocks. Routing
    decides both the hit rate (about 0.5-0.55) and the TTFT (a router blind to load piles
    the popular tenants on few workers); one session a second less and the free-block room
    stops mattering (docs/benchmarks.md).
    """

    tenants: int = 40
    sessions: int = 600
    system_prompts: tuple[int, int] = (1, 3)
    system_chunks: tuple[int, int] = (2, 6)      # 1K-3K tokens
    turns: tuple[int, int] = (4, 12)
    user_tokens: tuple[int, int] = (20, 400)
    answer_tokens: tuple[int, int] = (40, 600)
    think_s: tuple[float, float] = (2.0, 30.0)
    answer_s_per_token: float = 0.02             # answers stream at 50 tokens/s
    session_rate_per_s: float = 4.0
    zipf: float = 1.1
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("system_prompts", "system_chunks", "turns", "user_tokens",
                     "answer_tokens", "think_s"):
            low, high = getattr(self, name)
            if not 0 < low <= high:
                raise ValueError(f"{name} must be (low, high) with 0 < low <= high, "
                                 f"got {(low, high)}")
        if self.tenants < 1 or self.sessions < 0:
            raise ValueError("tenants must be >= 1 and sessions >= 0")
        if not (self.session_rate_per_s > 0 and self.answer_s_per_token >= 0
                and self.zipf >= 0):
            raise ValueError("session_rate_per_s must be > 0, answer_s_per_token and zipf "
                             ">= 0")


@dataclass(frozen=True)
class ChatTurn:
    arrival_s: float
    user_tokens: int
    answer_tokens: int


@dataclass(frozen=True)
class ChatSession:
    """One chat: its tenant's system prompt chunks, then its own chunks (``ids``).

    The session's text is ONE token stream: the system prompt, then chunk ``ids[j]`` at
    position ``j``. Turn ``k``'s prompt is the stream's first ``input_length(k)`` tokens, and
    the answer of turn ``k`` is what the stream holds after it. So a chunk a turn fills only
    in part keeps its id when the history grows past it, and every id follows one prefix
    (Mooncake's prefix-dependence): the replay builds each chunk's tokens from its id alone.
    """

    index: int
    tenant: int
    system_ids: tuple[int, ...]
    ids: tuple[int, ...]
    turns: tuple[ChatTurn, ...]

    @property
    def salt(self) -> str:
        return f"tenant-{self.tenant}"

    def input_length(self, k: int) -> int:
        """Prompt tokens of turn ``k``: system prompt + history + the new user message."""
        history = sum(t.user_tokens + t.answer_tokens for t in self.turns[:k])
        return len(self.system_ids) * CHUNK + history + self.turns[k].user_tokens

    def records(self) -> list[dict[str, object]]:
        """The session's turns as Mooncake trace records, in order."""
        out: list[dict[str, object]] = []
        for k, turn in enumerate(self.turns):
            n = self.input_length(k)
            own = -(-(n - len(self.system_ids) * CHUNK) // CHUNK)
            out.append({"timestamp": round(turn.arrival_s * 1000), "input_length": n,
                        "output_length": turn.answer_tokens,
                        "hash_ids": [*self.system_ids, *self.ids[:own]], "salt": self.salt})
        return out


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def chat_sessions(spec: ChatTraceSpec) -> list[ChatSession]:
    """The sessions of ``spec``, in start order (deterministic in ``spec``). Hash ids are
    unique across tenants and sessions: the system prompts' first, then each session's."""
    rng = random.Random(spec.seed)
    next_id = 0
    prompts: list[list[tuple[int, ...]]] = []
    for _ in range(spec.tenants):
        mine = []
        for _ in range(rng.randint(*spec.system_prompts)):
            n = rng.randint(*spec.system_chunks)
            mine.append(tuple(range(next_id, next_id + n)))
            next_id += n
        prompts.append(mine)
    weights = [1.0 / (rank + 1) ** spec.zipf for rank in range(spec.tenants)]
    out: list[ChatSession] = []
    clock = 0.0
    for index in range(spec.sessions):
        clock += rng.expovariate(spec.session_rate_per_s)
        tenant = rng.choices(range(spec.tenants), weights)[0]
        system = rng.choice(prompts[tenant])
        turns, at = [], clock
        for _ in range(rng.randint(*spec.turns)):
            user = round(_log_uniform(rng, *spec.user_tokens))
            answer = round(_log_uniform(rng, *spec.answer_tokens))
            turns.append(ChatTurn(at, user, answer))
            at += answer * spec.answer_s_per_token + _log_uniform(rng, *spec.think_s)
        said = sum(t.user_tokens + t.answer_tokens for t in turns) - turns[-1].answer_tokens
        own = -(-said // CHUNK)  # chunks of the last prompt past the system prompt
        out.append(ChatSession(index, tenant, system, tuple(range(next_id, next_id + own)),
                               tuple(turns)))
        next_id += own
    return out


def chat_trace(spec: ChatTraceSpec) -> list[dict[str, object]]:
    """Every turn of ``chat_sessions(spec)`` as a Mooncake record (``timestamp`` ms,
    ``input_length``, ``output_length``, ``hash_ids``, ``salt``), in arrival order (ties:
    session start order, so a session's turns stay in order)."""
    keyed = [(rec["timestamp"], s.index, k, rec)
             for s in chat_sessions(spec) for k, rec in enumerate(s.records())]
    keyed.sort(key=lambda x: x[:3])
    return [rec for *_, rec in keyed]
