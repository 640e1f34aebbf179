"""The side-by-side workload of ``kvmesh bench serve``: tenants sharing an app's prompts.

Several tenants run the same application: the same few system prompts (an app template),
each tenant with its own cache salt (vLLM's ``cache_salt``: tenants never share KV, even for
identical text). Every tenant holds a few multi-turn chats; turn ``k`` of a chat is the
system prompt, the earlier turns and a new user message, so each turn extends the previous
turn's prompt.

Contract:

- ``build_rounds(spec)`` is deterministic in ``spec`` (seeded). Round ``k`` holds turn ``k``
  of every chat, in a seeded shuffled order; a runner sends a round's requests
  concurrently and starts round ``k+1`` when round ``k`` is done.
- Text is ASCII and ``token_ids == list(text.encode())``: the tiny model's byte vocabulary,
  so a text-based router (Ray's ``PrefixCacheAffinityRouter``) and a token-based one see
  the same prefixes, character for token.
- ``ceiling_tokens(rounds, block_size)``: tokens a perfect router with unbounded caches
  could serve from cache (per request: the longest block-aligned prefix, at most
  ``len - 1`` tokens, shared with any request of the same salt sent before it, in order).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from deploy.ray.request import ServeRequest

_WORDS = ("the", "cache", "model", "token", "prefix", "tenant", "query", "answer", "node",
          "replica", "block", "route", "index", "latency", "batch", "prompt", "policy",
          "memory", "vector", "search", "report", "order", "invoice", "account", "status")


@dataclass(frozen=True)
class WorkloadSpec:
    """Sizes of the workload (characters == tokens)."""

    tenants: int = 4
    system_prompts: int = 2
    chats_per_tenant: int = 3
    turns: int = 3
    system_chars: int = 640
    user_chars: int = 96
    answer_chars: int = 64
    max_tokens: int = 4
    seed: int = 0


def _text(rng: random.Random, chars: int) -> str:
    words: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(_WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:chars]


def build_rounds(spec: WorkloadSpec) -> list[list[ServeRequest]]:
    """Round k = turn k of every chat (see the module docstring)."""
    rng = random.Random(spec.seed)
    systems = [f"System: you are assistant {i} of the app. " + _text(rng, spec.system_chars)
               for i in range(spec.system_prompts)]
    chats = []  # (salt, history text)
    for t in range(spec.tenants):
        for c in range(spec.chats_per_tenant):
            system = systems[(t + c) % spec.system_prompts]
            chats.append([f"tenant-{t}", system])
    rounds = []
    for _ in range(spec.turns):
        batch = []
        for chat in chats:
            chat[1] += "\nUser: " + _text(rng, spec.user_chars) + "\nAssistant:"
            text = chat[1]
            batch.append(ServeRequest(token_ids=list(text.encode()), salt=chat[0],
                                      max_tokens=spec.max_tokens, prompt=text))
            chat[1] += " " + _text(rng, spec.answer_chars)
        rng.shuffle(batch)
        rounds.append(batch)
    return rounds


def ceiling_tokens(rounds: list[list[ServeRequest]], block_size: int) -> int:
    """Cache-servable tokens under perfect routing and unbounded caches."""
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
