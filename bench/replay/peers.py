"""Peer routers that keep their own idea of the caches instead of reading a KV index.

:class:`ApproxTreeRouter` (SGLang's cache-aware policy, its defaults) and
:class:`RayPrefixTreeRouter` (Ray Serve's ``PrefixTree``, driven as
``PrefixCacheAffinityRouter`` drives it). Both see only the prompt and requests in flight;
neither sees evictions.

See docs/architecture.md#replay-and-simulation.
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
