"""The engine: one model, one prefix-caching KV pool, continuous batching.

``Engine.step()`` runs one batched forward over what the scheduler picked. A prefill computes
only the tokens after the verified cached prefix, so greedy output is identical with and
without cache hits. With KV tiers, each step runs the manager's copy orders after scheduling
and before the forward. Two ways in: the batch ``generate`` call, and ``add_request`` +
``step`` for a long-lived loop (``AsyncEngine``).

See docs/architecture.md#worker-engine-and-model.
"""
from __future__ import annotations

import functools
import itertools
import logging
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from kvmesh.contract import DEFAULT_ALGO
from kvmesh.hashing import Lora, MMItem, block_hashes, lora_key, none_hash
from kvmesh.quota import DEFAULT_TENANT
from worker.engine.costs import CostMeter, calibrate
from worker.engine.sampler import sample
from worker.engine.scheduler import Scheduled, Scheduler, SchedulerConfig
from worker.engine.sequence import SamplingParams, Seq, SeqStatus
from worker.kv_cache import KVCacheManager, KVRequest, Pinned
from worker.kv_cache.tier_config import TierConfig
from worker.kv_io.copy_executor import CopyExecutor
from worker.kv_io.disk_store import DiskStore
from worker.kv_io.onboard_log import OnboardLog
from worker.model import AttentionMetadata, load_model
from worker.model.fingerprint import model_fingerprint

log = logging.getLogger("kvmesh.worker.engine")

DEFAULT_KV_BYTES_CPU = 256 << 20
GPU_MEMORY_FRACTION = 0.85
ONBOARD_WAIT_S = 0.05  # a step with nothing runnable waits this long for a copy to land


class RequestError(ValueError):
    """A request the engine can never serve (bad token ids, too long, bigger than the pool).
    ``too_large`` tells the caller to answer RESOURCE_EXHAUSTED instead of INVALID_ARGUMENT."""

    def __init__(self, message: str, *, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large


class StepFailed(RuntimeError):
    """A step raised (out of memory, a kernel error, ...): the worker's fault, not the
    request's. ``seqs`` were scheduled in it and are aborted (finish reason ``"error"``);
    no block whose KV the step should have written stays cached. The engine serves on."""

    def __init__(self, seqs: list[Seq], cause: BaseException) -> None:
        super().__init__(f"engine step failed ({type(cause).__name__}: {cause}); "
                         f"{len(seqs)} request(s) in it were aborted")
        self.seqs = seqs


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    num_cached_tokens: int
    finish_reason: str  # "stop" (an EOS token) or "length" (max_tokens)
    prompt_tokens: int
    ttft_s: float
    # num_cached_tokens per tier the blocks came from: {"gpu": .., "cpu": .., "disk": ..},
    # plus "peer" when blocks pulled from another worker for it were hit
    cached_tokens_by_tier: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StepOutput:
    """What one step produced for one sequence (``new_token_ids`` may be empty mid-prefill)."""

    seq_id: str
    new_token_ids: list[int]
    finished: bool
    seq: Seq


class Engine:
    def __init__(self, model: torch.nn.Module, config, *, block_size: int = 16,
                 num_blocks: int | None = None, hash_algo: str = DEFAULT_ALGO,
                 hash_seed: str | None = None, scheduler: SchedulerConfig | None = None,
                 kv_cache_bytes: int | None = None, tiers: TierConfig | None = None,
                 cpu_blocks: int | None = None, disk_blocks: int | None = None,
                 disk_dir: str | Path | None = None, eviction: str | None = None,
                 auto_pin: bool | None = None, write_behind: bool = True) -> None:
        """``tiers`` holds every tier setting; the single tier arguments (the engine's API
        before ``TierConfig``) override its fields one by one. ``write_behind``: offloads run
        behind the step (False: before its forward; the output is the same either way)."""
        self.model = model
        self.config = config
        self.block_size = block_size
        self.device = model.device
        if num_blocks is None:
            num_blocks = self._blocks_for_budget(kv_cache_bytes)
        given = {"cpu_blocks": cpu_blocks, "disk_blocks": disk_blocks, "disk_dir": disk_dir,
                 "eviction": eviction, "auto_pin": auto_pin}
        tiers = replace(tiers or TierConfig(), **{k: v for k, v in given.items() if v is not None})
        tiers.check()
        self.kv = KVCacheManager(num_blocks, block_size, hash_algo=hash_algo,
                                 hash_seed=hash_seed, **tiers.manager_kwargs())
        self.kv_cache = model.allocate_kv_cache(num_blocks, block_size)
        self.costs = CostMeter(block_size)
        self.onboards = OnboardLog()  # the monitoring's onboard times (worker.rpc.metrics)
        self.peer_fetch = False  # serves and receives peer blocks (set by the worker process)
        self.copies: CopyExecutor | None = None
        if tiers.lower:
            store = None
            if tiers.disk_blocks:
                store = DiskStore(tiers.disk_dir, self.fingerprint,
                                  config.kv_cache_bytes_per_block(block_size, self.kv_cache.dtype))
            self.copies = CopyExecutor(self.kv_cache, tiers.cpu_blocks, store,
                                       write_behind=write_behind)
            calibrate(self.costs, model, self.kv_cache, self.copies,
                      (scheduler or SchedulerConfig()).max_batched_tokens)
            if store is not None:  # what an earlier run left on disk is announced again
                kept = self.kv.restore_disk(store.scan())
                store.keep_only(kept)
                if store.rejected:
                    log.warning("disk tier: %d block files restored, %d unusable ones "
                                "deleted (damaged, or not written by this worker)",
                                len(kept), store.rejected)
        self.scheduler = Scheduler(self.kv, scheduler)
        self.eos = set(config.eos_token_ids)
        self._ids = itertools.count()
        self.requests_done = 0

    @functools.cached_property
    def fingerprint(self) -> bytes:
        """The model fingerprint (``worker.model.fingerprint``): the disk tier's directory
        and what a peer fetch's blocks must match."""
        algo, seed = self.kv.hash_algo, self.kv.hash_seed
        return model_fingerprint(self.model, self.config, self.block_size,
                                 self.kv_cache.dtype, algo, none_hash(algo, seed))

    @classmethod
    def from_pretrained(cls, path_or_name: str | Path, block_size: int = 16,
                        num_blocks: int | None = None, device: str | None = None,
                        dtype: torch.dtype | None = None, hash_algo: str = DEFAULT_ALGO,
                        hash_seed: str | None = None, **kwargs) -> Engine:
        """Load ``"tiny"`` or a Hugging Face directory; ``num_blocks=None`` sizes the pool
        from a memory budget (256 MiB on CPU, 85% of free GPU memory on CUDA). ``kwargs``
        go to the constructor: ``scheduler``, ``kv_cache_bytes``, ``tiers`` (a
        ``worker.kv_cache.tier_config.TierConfig``) or its fields one by one (``cpu_blocks``,
        ``disk_blocks``, ``disk_dir``, ``eviction``, ``auto_pin``)."""
        model, config = load_model(path_or_name, device=device, dtype=dtype)
        return cls(model, config, block_size=block_size, num_blocks=num_blocks,
                   hash_algo=hash_algo, hash_seed=hash_seed, **kwargs)

    def _blocks_for_budget(self, budget: int | None) -> int:
        per_block = self.config.kv_cache_bytes_per_block(self.block_size, self.model.dtype)
        if budget is None:
            if self.device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(self.device)
                budget = int(free * GPU_MEMORY_FRACTION)
            else:
                budget = DEFAULT_KV_BYTES_CPU
        return max(1, budget // per_block)

    # --- requests -------------------------------------------------------------------

    def validate(self, prompt: list[int], params: SamplingParams) -> None:
        """Raise ``RequestError`` for a request that can never be served; changes nothing."""
        if not prompt:
            raise RequestError("the prompt is empty: send at least one token id")
        vocab = self.config.vocab_size
        lo, hi = min(prompt), max(prompt)  # C loops: prompts can be 100K tokens
        if lo < 0 or hi >= vocab:
            bad = lo if lo < 0 else hi
            raise RequestError(f"token id {bad} is outside the vocabulary [0, {vocab})")
        if params.max_tokens < 1:
            raise RequestError(f"max_tokens must be >= 1, got {params.max_tokens}")
        if not 0 <= params.temperature < math.inf:  # NaN would silently mean greedy
            raise RequestError(f"temperature must be finite and >= 0, got {params.temperature}")
        total = len(prompt) + params.max_tokens
        ctx = self.config.max_position_embeddings
        if total > ctx:
            raise RequestError(f"prompt ({len(prompt)} tokens) + max_tokens "
                               f"({params.max_tokens}) exceeds the model's context of {ctx}")
        if not self.kv.can_ever_fit(total):
            raise RequestError(
                f"prompt + max_tokens = {total} tokens needs "
                f"{self.kv.num_blocks_needed(total)} blocks; this worker's pool has only "
                f"{self.kv.num_blocks}", too_large=True)

    def add_request(self, prompt: list[int], params: SamplingParams | None = None, *,
                    request_id: str | None = None, salt: str | None = None,
                    lora: Lora | None = None, mm: tuple[MMItem, ...] = (),
                    tenant: str = DEFAULT_TENANT) -> Seq:
        """Queue one request (``tenant``: charged for the blocks it caches). ``RequestError``."""
        params = params or SamplingParams()
        prompt = [int(t) for t in prompt]
        self.validate(prompt, params)
        return self.enqueue(prompt, params, request_id=request_id, salt=salt, lora=lora, mm=mm,
                            tenant=tenant)

    def enqueue(self, prompt: list[int], params: SamplingParams, *,
                request_id: str | None = None, salt: str | None = None,
                lora: Lora | None = None, mm: tuple[MMItem, ...] = (),
                tenant: str = DEFAULT_TENANT) -> Seq:
        """``add_request`` for a prompt already converted to ints and validated (the batch
        call and the asyncio driver validate first, so a bad request never gets queued)."""
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        lora = lora_key(*lora) if lora is not None else None  # ("", "") is no LoRA, as on the wire
        seq = Seq(KVRequest(rid, prompt, salt=salt or None, lora=lora, mm=tuple(mm),
                            num_prompt_tokens=len(prompt), tenant=tenant or DEFAULT_TENANT),
                  params, num_prompt_tokens=len(prompt))
        if params.sampled:
            seq.generator = torch.Generator().manual_seed(
                params.seed if params.seed is not None else torch.seed())
        self.scheduler.add(seq)
        return seq

    def abort(self, seq: Seq) -> None:
        if seq.status is not SeqStatus.FINISHED:
            self.scheduler.finish(seq, "abort")

    def has_work(self) -> bool:
        """Requests to serve, or copies in flight (an aborted request's onboard must still
        be finished: its device blocks are released then)."""
        return self.scheduler.has_work() or (self.copies is not None
                                             and self.copies.onboarding())

    def close(self) -> None:
        """Finish pending copies (disk writes included) and stop the copy thread."""
        if self.copies is not None:
            self.copies.close()

    # --- the step -------------------------------------------------------------------

    def step(self) -> list[StepOutput]:
        """Schedule and run one batch. Raises ``StepFailed`` if anything in it raises: the
        batch's blocks are uncached (see ``KVCacheManager.step``) and its sequences
        aborted, while sequences outside it keep their state and later steps serve them."""
        work: list[Scheduled] | None = None
        out: list[StepOutput] = []
        try:
            if self.copies is not None:
                self._finish_onboards()
            with self.kv.step():
                work = self.scheduler.schedule()
                if self.copies is not None:
                    try:
                        self.copies.execute(self.kv.take_transfers())
                    finally:  # before the step's events go out: no entry without bytes
                        self.settle_copies()
                if work:
                    out = self._run(work)
        except Exception as exc:
            # A failure inside scheduling leaves the batch unknown: every running sequence
            # may hold a block cached in it, so all of them go.
            seqs = [w.seq for w in work] if work is not None else list(self.scheduler.running)
            for seq in seqs:
                if seq.status is not SeqStatus.FINISHED:
                    self.scheduler.finish(seq, "error")
            raise StepFailed(seqs, exc) from exc
        if not work and self.copies is not None and self.copies.onboarding():
            self.copies.wait(ONBOARD_WAIT_S)  # nothing runnable until a copy lands
        return out

    def settle_copies(self) -> int:
        """Hand the copies the data plane could not make (a failed offload, a refused or
        failed disk write) to the manager, which drops their entries (``PoolRemoved``)
        before they are spilled, onboarded or announced again; how many it dropped. Run in
        every step and by an idle engine loop (a background write may fail meanwhile)."""
        return 0 if self.copies is None else self.kv.copies_lost(self.copies.take_lost())

    def _finish_onboards(self) -> None:
        """Hand the disk writes that failed since the last step (their entries go) and the
        onboards that completed to the manager (their blocks become cached, or, failed, are
        freed and the request recomputes) and time them."""
        self.settle_copies()
        for done in self.copies.poll():
            for tier, blocks in done.blocks.items():
                self.costs.onboard(tier, blocks, done.seconds[tier])
                self.onboards.observe(tier, blocks, done.seconds[tier])
            self.kv.finish_onboard(done.request_id, done.ok, done.failed)

    def _run(self, work: list[Scheduled]) -> list[StepOutput]:
        start = time.perf_counter()
        tokens: list[int] = []
        rows = []
        written: list[int] = []  # the blocks this step writes KV into
        for w in work:
            end = w.num_computed + w.num_new_tokens
            tokens.extend(w.seq.req.token_ids[w.num_computed:end])
            rows.append((table := self.kv.get_block_ids(w.seq.req), w.num_computed,
                         w.num_new_tokens))
            written += table[w.num_computed // self.block_size:(end - 1) // self.block_size + 1]
        meta = AttentionMetadata.build(rows, self.block_size, self.device)
        input_ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        # A block still being copied out (write-behind) is written only after its copy.
        cache = self.kv_cache if self.copies is None else self.copies.gate(written)
        hidden = self.model(input_ids, meta.positions, meta, cache)
        # Only sequences whose every token is now computed produce a token this step.
        done = [i for i, w in enumerate(work)
                if w.num_computed + w.num_new_tokens == w.seq.num_tokens]
        sampled: list[int] = []
        if done:
            logits = self.model.compute_logits(hidden[meta.last_token_indices[done]])
            sampled = sample(logits, [work[i].seq for i in done])
        now = time.perf_counter()
        self.costs.step(len(tokens), sum(w.num_new_tokens for w in work
                                         if w.num_new_tokens > 1), now - start)
        out: list[StepOutput] = []
        new_tokens = dict(zip(done, sampled, strict=True))
        for i, w in enumerate(work):
            seq = w.seq
            seq.req.num_computed_tokens = w.num_computed + w.num_new_tokens
            if i not in new_tokens:
                out.append(StepOutput(seq.seq_id, [], False, seq))
                continue
            token = new_tokens[i]
            seq.req.token_ids.append(token)
            if seq.first_token_at is None:
                seq.first_token_at = now
            reason = self._stop_reason(seq, token)
            if reason is not None:
                seq.finished_at = now
                self.scheduler.finish(seq, reason)
                self.requests_done += 1
            out.append(StepOutput(seq.seq_id, [token], reason is not None, seq))
        return out

    def _stop_reason(self, seq: Seq, token: int) -> str | None:
        if token in self.eos and not seq.params.ignore_eos:
            return "stop"
        if len(seq.output_ids) >= seq.params.max_tokens:
            return "length"
        return None

    # --- batch API ------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], max_tokens: int = 16,
                 salt: str | None = None, temperature: float = 0.0, seed: int | None = None,
                 lora: Lora | None = None, ignore_eos: bool = False,
                 tenant: str = DEFAULT_TENANT) -> list[Completion]:
        """Run ``prompts`` to completion as one continuously batched workload. Raises
        ``StepFailed`` if a step fails; the whole batch is then aborted."""
        params = SamplingParams(max_tokens, temperature, seed, ignore_eos)
        prompts = [[int(t) for t in p] for p in prompts]
        for p in prompts:  # validate all first so a bad prompt leaves nothing queued
            self.validate(p, params)
        seqs = [self.enqueue(p, params, salt=salt, lora=lora, tenant=tenant) for p in prompts]
        try:
            while any(s.status is not SeqStatus.FINISHED for s in seqs):
                self.step()
        except BaseException:  # StepFailed: the rest of the batch must not linger queued
            for s in seqs:
                self.abort(s)
            raise
        return [Completion(s.output_ids, s.num_cached_tokens, s.finish_reason,
                           s.num_prompt_tokens, s.ttft_s or 0.0, s.cached_tokens_by_tier)
                for s in seqs]

    # --- pins -----------------------------------------------------------------------

    def pin(self, token_ids: list[int] | None = None, *, salt: str | None = None,
            lora: Lora | None = None, mm: tuple[MMItem, ...] = (),
            block_hashes: list[bytes] | None = None, ttl_s: float,
            warm: bool = False) -> Pinned:
        """Pin a prefix's cached device blocks for ``ttl_s`` seconds (refreshed by use): the
        prefix is ``token_ids`` (+ salt/LoRA/mm) or its chain ``block_hashes``. Returns the
        blocks pinned now (from block 0, as far as this worker holds the chain, within the
        pin cap, automatic pins giving way), of how many, and whether the cap cut it short.
        ``warm`` (``token_ids`` only): if not all of it is held (and explicit pins leave the
        cap room), prefill it as a request of its own, pinned at the first step after it is
        computed. Call between steps (engine thread). Raises ``RequestError`` on bad input."""
        if not ttl_s > 0:
            raise RequestError(f"ttl_s must be > 0, got {ttl_s}")
        chain = self._pin_chain(token_ids, salt, lora, mm, block_hashes)
        pinned = self.kv.pin(chain, ttl_s)
        if warm and pinned < len(chain) and self.kv.pins.num_explicit < self.kv.pins.cap:
            if token_ids is None:
                raise RequestError("warm needs token_ids, not block hashes")
            seq = self.add_request(token_ids, SamplingParams(max_tokens=1), salt=salt,
                                   lora=lora, mm=mm)
            self.kv.pin_when_computed(seq.req, ttl_s)
        return pinned

    def unpin(self, token_ids: list[int] | None = None, *, salt: str | None = None,
              lora: Lora | None = None, mm: tuple[MMItem, ...] = (),
              block_hashes: list[bytes] | None = None) -> int:
        """Release the pins of a prefix (and of everything pinned after it); returns the
        number of blocks unpinned."""
        return self.kv.unpin(self._pin_chain(token_ids, salt, lora, mm, block_hashes))

    def _pin_chain(self, token_ids: list[int] | None, salt: str | None, lora: Lora | None,
                   mm: tuple[MMItem, ...], chain: list[bytes] | None) -> list[bytes]:
        if (token_ids is None) == (chain is None):
            raise RequestError("give token_ids or block_hashes (one of them)")
        if chain is not None:
            return list(chain)
        lora = lora_key(*lora) if lora is not None else None
        return block_hashes([int(t) for t in token_ids], self.block_size,
                            algo=self.kv.hash_algo, seed=self.kv.hash_seed, salt=salt or None,
                            lora=lora, mm=tuple(mm))

    # --- reporting ------------------------------------------------------------------

    def load(self) -> dict[str, int | float | bool]:
        """What the router's cost model reads (mirrors the proto's ``WorkerLoad``): the
        queues and the measured costs (``worker.engine.costs``; 0.0 = not measured yet)."""
        sched = self.scheduler
        return {"running": len(sched.running), "waiting": len(sched.waiting),
                "queued_prefill_tokens": sched.queued_prefill_tokens,
                "free_blocks": self.kv.num_free_blocks, "total_blocks": self.kv.num_blocks,
                "free_empty_blocks": self.kv.num_free_empty_blocks,
                "decode_tokens": sum(s.num_tokens for s in sched.running),
                "tier_blocks": sum(t.capacity_blocks for name, t in self.kv.tier_stats().items()
                                   if name != "gpu"),
                "peer_fetch": self.peer_fetch, **self.costs.load()}

