"""Continuous batching: which sequences run this step, and how many tokens each.

Each step has a token budget: running sequences first (decode 1 token, chunked prefill what
is left), then waiting ones while budget, ``max_seqs`` and blocks allow. A sequence that
cannot get a block preempts the most recently admitted one by recompute; ``allocate_slots``
succeeds whole or changes nothing, so the pool is never corrupted.

See docs/architecture.md#worker-engine-and-model.
"""
from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

from worker.engine.sequence import Seq, SeqStatus
from worker.kv_cache import KVCacheManager


@dataclass(frozen=True)
class SchedulerConfig:
    max_batched_tokens: int = 2048
    max_seqs: int = 64


@dataclass(frozen=True)
class Scheduled:
    """``seq`` computes ``num_new_tokens`` tokens starting at ``num_computed`` this step."""

    seq: Seq
    num_computed: int
    num_new_tokens: int


class Scheduler:
    def __init__(self, kv: KVCacheManager, config: SchedulerConfig | None = None) -> None:
        self.kv = kv
        self.config = config or SchedulerConfig()
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.num_preemptions = 0
        # Hashes of the full prompt blocks of every queued (waiting or running) sequence:
        # blocks that will be cached before a sequence added now runs.
        self._promised: Counter[bytes] = Counter()
        self._promises: dict[str, list[bytes]] = {}  # seq id -> its hashes in _promised

    def add(self, seq: Seq) -> None:
        # Look the prompt up now so the load this worker reports counts only the prefill it
        # will really do: the router must not see a worker that holds a hot prefix as
        # busier than one that would recompute it. A prefix that a sequence ahead in the
        # queue computes counts as cached too: a burst of requests sharing a new prefix
        # prefills it once, not once each. The same lookup keeps the hits warm (their only
        # effect: the free queue's order), so the admissions ahead of it evict other blocks.
        cached = sum(self.kv.keep_warm(seq.req).values())
        bs = self.kv.block_size
        full = seq.req.block_hashes[:seq.num_prompt_tokens // bs]  # cached once computed
        usable = min(max(seq.num_prompt_tokens - 1, 0) // bs, len(full))
        ahead = 0
        while ahead < usable and full[ahead] in self._promised:
            ahead += 1
        seq.expected_cached = max(cached, ahead * bs)
        self._promised.update(full)
        self._promises[seq.seq_id] = full
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[Scheduled]:
        """Pick this step's work and allocate its slots (caching the blocks it fills). Call it
        inside ``KVCacheManager.step``; the caller must run every returned item before
        scheduling again, and if that fails, finish every returned sequence (their blocks
        are uncached; see ``Engine.step``)."""
        budget = self.config.max_batched_tokens
        out: list[Scheduled] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_uncomputed, budget)
            while self.kv.allocate_slots(seq.req, n) is None:
                victim = self.running.pop()  # never scheduled yet: we go front to back
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status is not SeqStatus.RUNNING:
                break
            out.append(Scheduled(seq, seq.req.num_computed_tokens, n))
            budget -= n
            i += 1
        # Admit new work only when nothing was preempted: otherwise it would evict the
        # blocks the preempted sequence is about to need again.
        w = 0  # index of the next waiting sequence: those before it are onboarding
        while (not preempted and w < len(self.waiting) and budget > 0
               and len(self.running) < self.config.max_seqs):
            seq = self.waiting[w]
            if self.kv.onboarding(seq.req):
                w += 1
                continue
            hits, num_hit = self.kv.get_computed_blocks(seq.req)
            if self.kv.start_onboard(seq.req, hits):
                w += 1
                continue
            n = min(seq.num_tokens - num_hit, budget)
            if self.kv.allocate_slots(seq.req, n, hits, num_hit) is None:
                # Blocks held for onboarded sequences behind this one must not starve it.
                self.kv.release_holds(keep=seq.req)
                break
            del self.waiting[w]
            seq.status = SeqStatus.RUNNING
            if seq.num_cached_tokens < 0:
                seq.num_cached_tokens = num_hit
                seq.cached_tokens_by_tier = self.kv.cached_tokens_by_tier(seq.req)
            seq.req.num_computed_tokens = num_hit
            self.running.append(seq)
            out.append(Scheduled(seq, num_hit, n))
            budget -= n
        return out

    def _preempt(self, seq: Seq) -> None:
        self.kv.preempt(seq.req)
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Seq, reason: str) -> None:
        """Mark a running or waiting sequence finished and release its blocks."""
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        for h in self._promises.pop(seq.seq_id, ()):
            left = self._promised[h] - 1
            if left:
                self._promised[h] = left
            else:
                del self._promised[h]
        self.kv.free(seq.req)

    @property
    def queued_prefill_tokens(self) -> int:
        """Prompt tokens not computed yet, over waiting and running sequences (router load)."""
        return (sum(s.num_uncomputed - s.expected_cached for s in self.waiting)
                + sum(s.num_uncomputed for s in self.running if s.num_uncomputed > 1))
