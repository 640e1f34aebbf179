"""Peer routers that keep their own idea of the caches instead of reading a KV index.

Both see what a router in front of the workers sees: the prompt, and how many requests each
worker has in flight. Neither sees evictions.

- :class:`ApproxTreeRouter` (``approx_tree``): SGLang router's cache-aware policy. It keeps
  an approximate radix tree per worker of the prompts it ROUTED there. If the load is
  imbalanced (``max - min > balance_abs_threshold`` and ``max > min * balance_rel_threshold``,
  load = requests in flight) it picks the least loaded worker; otherwise the worker with the
  longest match if the match rate exceeds ``cache_threshold``; otherwise the worker whose
  tree is smallest (SGLang's "most cache space left" fallback). The prompt is inserted into
  the chosen worker's tree. Defaults are SGLang's documented ones (0.5, 32, 1.0001). Its
  LRU bound ``max_tree_size`` (2**24 characters, ~4 characters per token) is applied every
  ``eviction_interval_s`` of simulated time, as SGLang's background eviction does.
  The tree's edges are the trace's 512-token chunks (with how many of a chunk's tokens were
  routed), which is the token-level radix tree compressed: a chunk's tokens are a function
  of its id, and two different chunks share no prefix to speak of. Like SGLang's text tree
  it is blind to salts and LoRA.
- :class:`RayPrefixTreeRouter` (``ray_prefix_tree``): Ray Serve's ``PrefixTree``, imported
  from the installed ``ray`` package, driven the way ``PrefixCacheAffinityRouter`` drives
  it: the prompt as text (one character per token here), power-of-two choices when the
  queue-length spread exceeds ``imbalanced_threshold`` (Ray's default: never), else the
  tenants holding the longest match when the match rate reaches ``match_rate_threshold``
  (0.1), else the tenants with the fewest characters; among the candidates the shortest
  queue wins; after routing the text is inserted for the chosen replica. Ray's optional tree
  eviction is off by default and off here.
"""
from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Sequence

from .trace import CHUNK_TOKENS, TokenSynth, TraceRequest

SGLANG_CHARS_PER_TOKEN = 4


def _least(cands: Sequence[int], loads: Sequence[int], rng: random.Random) -> int:
    """The candidate with the fewest requests in flight; ties at random."""
    best = min(loads[i] for i in cands)
    return rng.choice([i for i in cands if loads[i] == best])


def _chunk_lengths(req: TraceRequest) -> list[int]:
    n, last = len(req.hash_ids), req.input_length - (len(req.hash_ids) - 1) * CHUNK_TOKENS
    return [CHUNK_TOKENS] * (n - 1) + [last]


class ApproxTreeRouter:
    """SGLang-router-style cache-aware routing over an approximate per-worker tree."""

    name = "approx_tree"

    def __init__(self, num_workers: int, rng: random.Random, *, cache_threshold: float = 0.5,
                 balance_abs_threshold: int = 32, balance_rel_threshold: float = 1.0001,
                 max_tree_tokens: int = 2**24 // SGLANG_CHARS_PER_TOKEN,
                 eviction_interval_s: float = 60.0) -> None:
        self.n, self.rng = num_workers, rng
        self.cache_threshold = cache_threshold
        self.abs_threshold, self.rel_threshold = balance_abs_threshold, balance_rel_threshold
        self.max_tree_tokens, self.eviction_interval_s = max_tree_tokens, eviction_interval_s
        self.nodes: dict[int, dict[int, int]] = {}  # chunk id -> worker -> tokens routed
        self.lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_workers)]
        self.size = [0] * num_workers  # tokens in each worker's tree
        self._last_eviction = 0.0

    def match(self, req: TraceRequest) -> list[int]:
        """Tokens of ``req``'s prompt each worker's tree matches from the start."""
        matched = [0] * self.n
        active = set(range(self.n))
        for h, want in zip(req.hash_ids, _chunk_lengths(req), strict=True):
            holders = self.nodes.get(h, {})
            for w in list(active):
                got = holders.get(w, 0)
                matched[w] += min(got, want)
                if got < want:
                    active.discard(w)
            if not active:
                break
        return matched

    def insert(self, req: TraceRequest, w: int) -> None:
        lru = self.lru[w]
        pairs = list(zip(req.hash_ids, _chunk_lengths(req), strict=True))
        for h, n in reversed(pairs):  # deepest first: parents end up most recent
            entry = self.nodes.setdefault(h, {})
            prev = entry.get(w, 0)
            if n > prev:
                entry[w] = n
                self.size[w] += n - prev
            lru[h] = None
            lru.move_to_end(h)

    def evict(self, now: float) -> None:
        """SGLang's periodic LRU eviction down to ``max_tree_tokens`` per worker."""
        if now - self._last_eviction < self.eviction_interval_s:
            return
        self._last_eviction = now
        for w in range(self.n):
            lru = self.lru[w]
            while self.size[w] > self.max_tree_tokens and lru:
                h, _ = lru.popitem(last=False)
                entry = self.nodes[h]
                self.size[w] -= entry.pop(w)
                if not entry:
                    del self.nodes[h]

    def choose(self, req: TraceRequest, loads: Sequence[int], now: float) -> int:
        """The worker for ``req`` given each worker's requests in flight; records it."""
        self.evict(now)
        hi, lo = max(loads), min(loads)
        if hi - lo > self.abs_threshold and hi > lo * self.rel_threshold:
            w = _least(range(self.n), loads, self.rng)
        else:
            matched = self.match(req)
            best = max(matched)
            if best / req.input_length > self.cache_threshold:
                w = _least([i for i in range(self.n) if matched[i] == best], loads, self.rng)
            else:
                small = min(self.size)
                w = _least([i for i in range(self.n) if self.size[i] == small], loads, self.rng)
        self.insert(req, w)
        return w


class RayPrefixTreeRouter:
    """Ray Serve's ``PrefixCacheAffinityRouter`` logic around Ray's own ``PrefixTree``."""

    name = "ray_prefix_tree"

    def __init__(self, num_workers: int, rng: random.Random, synth: TokenSynth, *,
                 imbalanced_threshold: float = math.inf,
                 match_rate_threshold: float = 0.1) -> None:
        try:
            from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree import (
                PrefixTree,
            )
        except ImportError as e:  # ray is an optional extra
            raise RuntimeError("the ray_prefix_tree policy needs Ray Serve LLM "
                               "(pip install 'kvmesh[ray]')") from e
        self.n, self.rng, self.synth = num_workers, rng, synth
        self.imbalanced_threshold = imbalanced_threshold
        self.match_rate_threshold = match_rate_threshold
        self.tenants = [f"replica-{i:02d}" for i in range(num_workers)]
        self._index = {t: i for i, t in enumerate(self.tenants)}
        self.tree = PrefixTree()
        self.tree.add_tenants(self.tenants, 0.0)

    def _pow2(self, loads: Sequence[int]) -> list[int]:
        if self.n == 1:
            return [0]
        return self.rng.sample(range(self.n), 2)

    def choose(self, req: TraceRequest, loads: Sequence[int], now: float) -> int:
        """The replica for ``req`` given each replica's queue length; records it."""
        text = self.synth.text(req)
        cands = self._pow2(loads)
        if max(loads) - min(loads) <= self.imbalanced_threshold:
            matched, tenants = self.tree.prefix_match(text, self.tenants)
            if len(matched) / len(text) < self.match_rate_threshold:
                chosen = self.tree.get_smallest_tenants()
            else:
                chosen = tenants
            if chosen:
                cands = [self._index[t] for t in chosen]
        w = _least(cands, loads, self.rng)
        self.tree.insert(text, self.tenants[w], now)
        return w
