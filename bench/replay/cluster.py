"""The simulated cluster: workers with a real KV cache manager, a clock, and a cost model.

Nothing runs a model. Each :class:`SimWorker` owns one real ``KVCacheManager`` and follows the
engine's call sequence, so hits, evictions and KV events are the real ones; only step times
come from :class:`CostModel`. Per worker: FIFO, prefill first, decode space reserved at
admission (no preemption), steps between two events simulated in one jump; lower tiers
onboard on a copy engine. A request that can never fit is rejected (counted).

See docs/architecture.md#replay-and-simulation.
"""
from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter, deque
from dataclasses import dataclass, field

from kvmesh.events.pool import PoolEvent
from service.index.base import WorkerLoad
from worker.kv_cache import KVCacheManager, KVRequest

from .copies import CopyTotals, offloads_s
from .fetch import FetchCost, FetchTotals, Plan, pull
from .trace import TraceRequest

OUTPUT_TOKEN = 1  # generated tokens are not modelled; their blocks only take space


@dataclass(frozen=True)
class CostModel:
    """Seconds per unit of GPU work; defaults: Llama-3-8B in bf16 on one H100-80GB.

    - ``prefill_s_per_token`` 5e-5 (20k prompt tokens/s): ~16 GFLOP/token for the linear
      layers plus causal attention at ~12k context is ~0.6 s for a 12k-token prompt at
      ~45% of the 989 TFLOP/s bf16 peak.
    - ``decode_step_s`` 5e-3: one step reads the 16 GB of weights at ~3.35 TB/s.
    - ``decode_s_per_ctx_token`` 4e-8: every step reads each context token's KV (128 KiB for
      Llama-3-8B: 32 layers x 8 KV heads x 128 dims x K,V x 2 bytes) at the same bandwidth.
    - ``max_running`` 256: vLLM's default ``max_num_seqs``.

    Copies between tiers (``bench tiers``; nothing else reads them), per block of
    ``block_size`` tokens of ``kv_bytes_per_token`` (128 KiB, above: 2 MiB per 16-token block):

    - ``pcie_bytes_per_s`` 25e9: device <-> pinned host, each way. H100's PCIe Gen5 x16 moves
      ~50 GB/s with large pinned copies; a paged block is 2 x 32 layers of 32 KiB pieces, and
      copies that small reach about half of it. Onboard (host -> device) and offload (device ->
      host) use opposite directions of the link.
    - ``disk_bytes_per_s`` 6e9: one PCIe Gen4 NVMe drive's sequential read; a disk onboard
      reads the file, then crosses PCIe (the two are not overlapped here).
    - ``host_copy_bytes_per_s`` 10e9: one thread's memcpy, the synchronous part of a spill
      (CPU slot -> staging buffer; the file write itself is asynchronous).

    Onboard per block: CPU 2 MiB / 25 GB/s = 84 us, disk + 350 us = 434 us, against 800 us to
    recompute its 16 tokens (ratios 0.10 and 0.54).

    ``offloads``: how the data plane runs offloads (device -> CPU). ``"write-behind"``
    (kvmesh's, ``worker/kv_io/write_behind.py``): on their own lane (the device -> host
    direction of PCIe, a copy engine of its own), behind the step; the prefill that reuses
    the evicted blocks writes each of its ``layers`` after that layer's copy, so it stalls
    only for what of the copies is not done when it would have ended, less its last layer;
    an onboard into a block being copied out ends after that copy. ``"sync"`` (the data
    plane before write-behind, ``Engine(write_behind=False)``): the offloads complete
    before the step, which stalls for all of them, and share one copy engine with onboards.
    Spills stall the step either way (their host memcpy runs on the engine thread).
    """

    prefill_s_per_token: float = 5e-5
    decode_step_s: float = 5e-3
    decode_s_per_ctx_token: float = 4e-8
    max_running: int = 256
    kv_bytes_per_token: int = 128 << 10
    pcie_bytes_per_s: float = 25e9
    disk_bytes_per_s: float = 6e9
    host_copy_bytes_per_s: float = 10e9
    offloads: str = "write-behind"  # or "sync"
    layers: int = 32  # Llama-3-8B's

    def prefill_s(self, tokens: int) -> float:
        return self.prefill_s_per_token * tokens

    def block_bytes(self, block_size: int) -> int:
        return self.kv_bytes_per_token * block_size

    def onboard_s(self, tier: str, block_size: int) -> float:
        """Seconds to copy one block from ``tier`` ("cpu" or "disk") into the device pool."""
        pcie = self.block_bytes(block_size) / self.pcie_bytes_per_s
        if tier == "cpu":
            return pcie
        if tier == "disk":
            return self.block_bytes(block_size) / self.disk_bytes_per_s + pcie
        raise ValueError(f"no onboard from tier {tier!r}")

    def offload_s(self, block_size: int) -> float:
        """Seconds to copy one device block out to its CPU slot."""
        return self.block_bytes(block_size) / self.pcie_bytes_per_s

    def spill_s(self, block_size: int) -> float:
        """Seconds of the synchronous part of a CPU -> disk spill (one block)."""
        return self.block_bytes(block_size) / self.host_copy_bytes_per_s

    def step_s(self, ctx_tokens: float) -> float:
        return self.decode_step_s + self.decode_s_per_ctx_token * ctx_tokens


@dataclass(eq=False)
class SimRequest:
    """A trace request in flight; the times are simulated seconds."""

    trace: TraceRequest
    kv: KVRequest
    worker: int = -1
    hit_tokens: int = 0
    prefill_tokens: int = 0
    ttft_s: float = math.nan
    finish_step: int = 0
    copy_s: float = 0.0  # synchronous copies its admission ordered (offloads, spills)
    expected_prefill: int = 0  # its prefill as the worker's load counts it while it waits
    hit_by_tier: dict[str, int] = field(default_factory=dict)
    fetch: Plan | None = None  # the route's peer fetch (``--peer-fetch``), made at admission
    fetched: tuple[int, int] | None = None  # the blocks it imported: [start, end)
    fetch_s: float = 0.0  # the import's transfer, which its prefill waits for

    @property
    def prompt_tokens(self) -> int:
        return self.trace.input_length


@dataclass
class WorkerTotals:
    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    prefill_tokens: int = 0
    busy_s: float = 0.0
    ttfts: list[float] = field(default_factory=list)
    hit_by_tier: dict[str, int] = field(default_factory=dict)  # sums to hit_tokens
    copies: CopyTotals = field(default_factory=CopyTotals)
    fetches: FetchTotals = field(default_factory=FetchTotals)


class SimWorker:
    """One simulated worker; see the module docstring for its scheduling rules.

    ``advance(until)`` runs the worker's own events up to the first step boundary at or
    after ``until`` (work started before ``until`` finishes); ``submit`` queues a request
    routed at ``now``; ``load(now)`` is what its heartbeat would report at ``now``. With
    ``fetch`` (``--peer-fetch``) it serves and receives peer blocks (:mod:`.fetch`) among
    ``fleet``, which the cluster sets.
    """

    def __init__(self, index: int, manager: KVCacheManager, cost: CostModel,
                 fetch: FetchCost | None = None) -> None:
        self.index, self.worker_id = index, f"w{index:02d}"
        self.kv, self.cost, self.fetch = manager, cost, fetch
        self.fleet: list[SimWorker] = []
        self._owed = 0.0  # serving peers' reads: charged to its next step
        self.clock = 0.0
        self.steps = 0
        self.waiting: deque[SimRequest] = deque()
        self.running: list[tuple[int, int, SimRequest]] = []  # heap by finish step
        self.ctx_tokens = 0
        self.totals = WorkerTotals()
        self._tie = itertools.count()
        self._prefill: tuple[float, float, int] | None = None  # start, end, tokens
        # The prefill the waiting requests will do, counted as the engine's scheduler counts
        # it (worker/engine/scheduler.py): what is cached at submit, or computed by a request ahead.
        self._waiting_tokens = 0
        self._promised: Counter[bytes] = Counter()  # full blocks of the waiting requests
        self._lower = len(manager.tier_stats()) > 1  # a CPU or disk tier to onboard from
        self._pins = manager.pins.auto
        self._onboard_end: float | None = None  # the head's onboard completes then
        self._onboard_since = 0.0
        self._copy_free = 0.0  # the copy engine (onboards) is busy until then
        self._offload_free = 0.0  # write-behind: the offload lane is busy until then

    # --- what a router sees -----------------------------------------------------------

    def load(self, now: float) -> WorkerLoad:
        """The engine's ``load()`` at ``now``: queued prefill = what the waiting requests
        will prefill (as the engine counts it) plus what is left of a prefill in progress."""
        queued = self._waiting_tokens
        running = len(self.running)
        if self._prefill is not None and self._prefill[1] > now:
            start, end, tokens = self._prefill
            queued += int(tokens * (end - max(now, start)) / max(end - start, 1e-12))
        fetch = self.fetch
        return WorkerLoad(running=running, waiting=len(self.waiting),
                          queued_prefill_tokens=queued, free_blocks=self.kv.num_free_blocks,
                          total_blocks=self.kv.num_blocks, decode_tokens=self.ctx_tokens,
                          free_empty_blocks=self.kv.num_free_empty_blocks,
                          prefill_us_per_token=self.cost.prefill_s_per_token * 1e6,
                          peer_fetch=fetch is not None,
                          fetch_us_per_block=fetch.block_s * 1e6 if fetch else 0.0,
                          fetch_us_per_call=fetch.call_s * 1e6 if fetch else 0.0)

    @property
    def in_flight(self) -> int:
        """Requests routed here and not finished (what a router counts per replica)."""
        return len(self.waiting) + len(self.running)

    def take_events(self) -> list[PoolEvent]:
        return self.kv.take_events()

    # --- simulation -------------------------------------------------------------------

    def fits(self, req: SimRequest) -> bool:
        """Whether ``req`` could ever be admitted (prompt + output within the pool)."""
        return self.kv.can_ever_fit(req.prompt_tokens + max(req.trace.output_length, 1))

    def submit(self, req: SimRequest, now: float) -> None:
        req.worker = self.index
        if not self.running and not self.waiting:
            self.clock = max(self.clock, now)
        full = self._full(req)
        usable = (req.prompt_tokens - 1) // self.kv.block_size
        ahead = 0
        while ahead < usable and full[ahead] in self._promised:
            ahead += 1
        # keep_warm, as the engine's scheduler does when a request queues; it counts the hits
        cached = max(sum(self.kv.keep_warm(req.kv).values()), ahead * self.kv.block_size,
                     req.fetch.end * self.kv.block_size if req.fetch else 0)
        req.expected_prefill = req.prompt_tokens - cached
        self._promised.update(full)
        self.waiting.append(req)
        self._waiting_tokens += req.expected_prefill

    def _full(self, req: SimRequest) -> list[bytes]:
        """The hashes of ``req``'s full prompt blocks (cached once it is admitted)."""
        return req.kv.block_hashes[:req.prompt_tokens // self.kv.block_size]

    def _try_admit(self) -> SimRequest | None:
        if not self.waiting or len(self.running) >= self.cost.max_running:
            return None
        req, kv = self.waiting[0], self.kv
        if self._pins:
            kv.expire_pins(self.clock)  # what the engine's step does first
        if self._onboard_end is not None:
            if self.clock < self._onboard_end:
                return None
            kv.finish_onboard(req.kv.request_id, True)
            self.totals.copies.onboard_wait_s += self.clock - self._onboard_since
            self._onboard_end = None
        if req.fetch is not None and req.fetched is None:
            self._pull(req)
        hits, n = kv.get_computed_blocks(req.kv)
        if self._lower and kv.start_onboard(req.kv, hits):
            start = max(self.clock, self._copy_free)
            orders = kv.take_transfers()
            copy = self.totals.copies.charge(orders, self.cost, kv.block_size)
            end = start + copy
            off, onboards = offloads_s(orders, self.cost, kv.block_size)
            if self.cost.offloads == "write-behind" and off:
                # its evicted blocks go out on the offload lane; each onboard copy into one
                # of them waits for its copy out: the last lands after the last offload
                off_end = self._offload_free = max(self._offload_free, self.clock) + off
                end = max(start + copy - off, off_end + (copy - off) / max(onboards, 1))
            self._onboard_since, self._copy_free = self.clock, end
            self._onboard_end = end
            return None
        out = max(req.trace.output_length, 1)
        need = (kv.num_blocks_needed(req.prompt_tokens + out) - len(hits)
                + sum(1 for b in hits if b.ref_cnt == 0))
        if need > kv.num_free_blocks:
            return None
        self.waiting.popleft()
        prompt = req.prompt_tokens
        self._waiting_tokens -= req.expected_prefill
        for h in self._full(req):
            left = self._promised[h] - 1
            if left:
                self._promised[h] = left
            else:
                del self._promised[h]
        if kv.allocate_slots(req.kv, prompt - n, hits, n) is None:
            raise AssertionError("admission was checked against the free blocks")
        prompt_orders = kv.take_transfers() if self._lower else []
        req.kv.num_computed_tokens = prompt
        req.kv.token_ids.extend([OUTPUT_TOKEN] * out)
        if kv.allocate_slots(req.kv, out) is None:
            raise AssertionError("decode slots were checked against the free blocks")
        req.hit_tokens, req.prefill_tokens = n, prompt - n
        if self._lower:
            orders = prompt_orders + kv.take_transfers()
            req.copy_s = self.totals.copies.charge(orders, self.cost, kv.block_size)
            off, _ = offloads_s(orders, self.cost, kv.block_size)
            if self.cost.offloads == "write-behind" and off:
                # the prompt's evicted blocks: behind the prefill that overwrites them,
                # layer by layer; the decode blocks' (reserved here, written by decode steps
                # to come, a block per block_size steps): queued behind them on the lane
                off_prompt, _ = offloads_s(prompt_orders, self.cost, kv.block_size)
                self._offload_free = max(self._offload_free, self.clock) + off_prompt
                prefill = self.cost.prefill_s(req.prefill_tokens)
                stall = self._offload_free - self.clock - prefill * (1 - 1 / self.cost.layers)
                self._offload_free += off - off_prompt
                req.copy_s += max(stall, 0.0) - off
            req.hit_by_tier = kv.cached_tokens_by_tier(req.kv)
        else:
            req.hit_by_tier = {"gpu": n}
        if req.fetched is not None:  # the imported blocks it hit came from the peer
            start, end = req.fetched
            peer = min(max(n - start * kv.block_size, 0), (end - start) * kv.block_size)
            req.hit_by_tier["gpu"] -= peer
            req.hit_by_tier["peer"] = peer
        return req

    def _pull(self, req: SimRequest) -> None:
        """Make ``req``'s planned fetch (:func:`.fetch.pull`): W's step waits for the
        transfer (``fetch_s``), the source pays the gather of what it served."""
        plan, fetch = req.fetch, self.fetch
        assert plan is not None and fetch is not None
        source = self.fleet[plan.source]
        start, n = pull(self.kv, source.kv, req.kv, plan.end)
        req.fetched = (start, start + n)
        t = self.totals.fetches
        t.planned_blocks += plan.blocks
        if not n:
            return
        seconds = fetch.seconds(n)
        req.fetch_s = seconds
        t.fetches, t.blocks, t.seconds = t.fetches + 1, t.blocks + n, t.seconds + seconds
        if source.waiting or source.running:  # an idle source's read delays nothing
            source._owed += n * fetch.source_block_s

    def _finish_due(self) -> list[SimRequest]:
        done: list[SimRequest] = []
        while self.running and self.running[0][0] <= self.steps:
            _, _, req = heapq.heappop(self.running)
            self.kv.free(req.kv)
            self.ctx_tokens -= req.prompt_tokens + max(req.trace.output_length - 1, 0)
            done.append(req)
        return done

    def advance(self, until: float) -> list[SimRequest]:
        """Simulate up to ``until`` (``math.inf``: until idle, or blocked on a shared pool's
        blocks held by other workers); returns the requests that finished."""
        done: list[SimRequest] = []
        while self.clock < until or (until == math.inf and (self.waiting or self.running)):
            req = self._try_admit()
            if req is not None:
                self._run_prefill(req)
                done += self._finish_due()
                continue
            onboard = self._onboard_end
            if not self.running:
                if onboard is not None and onboard <= until:  # idle until the copy is done
                    self.clock = max(self.clock, onboard)
                    continue
                # idle, or (pool shared with other workers) waiting for their blocks: retry
                # at the next call
                if until != math.inf:
                    self.clock = max(self.clock, until)
                break
            self._decode(until if onboard is None else min(until, onboard))
            done += self._finish_due()
        return done

    def _run_prefill(self, req: SimRequest) -> None:
        start = self.clock
        dt = self.cost.prefill_s(req.prefill_tokens) + req.copy_s + req.fetch_s + self._owed
        self._owed = 0.0
        self.clock += dt
        self._prefill = (start, self.clock, req.prefill_tokens)
        req.ttft_s = self.clock - req.trace.arrival_s
        t = self.totals
        t.requests += 1
        t.prompt_tokens += req.prompt_tokens
        t.hit_tokens += req.hit_tokens
        t.prefill_tokens += req.prefill_tokens
        for tier, tokens in req.hit_by_tier.items():
            t.hit_by_tier[tier] = t.hit_by_tier.get(tier, 0) + tokens
        t.busy_s += dt
        t.ttfts.append(req.ttft_s)
        req.finish_step = self.steps + max(req.trace.output_length - 1, 0)
        self.ctx_tokens += req.prompt_tokens
        heapq.heappush(self.running, (req.finish_step, next(self._tie), req))

    def _decode(self, until: float) -> None:
        """Decode steps up to the next finish, or to the first step boundary >= ``until``.
        A waiting head here is blocked on blocks or ``max_running``: only a finish helps."""
        batch = len(self.running)
        k = self.running[0][0] - self.steps
        if k <= 0:
            return
        if until != math.inf:
            k = max(1, min(k, math.ceil((until - self.clock) / self.cost.step_s(self.ctx_tokens))))
        step = self.cost.step_s(self.ctx_tokens + batch * (k - 1) / 2)  # context grows
        self.steps += k
        self.clock += k * step + self._owed
        self.totals.busy_s += k * step + self._owed
        self._owed = 0.0
        self.ctx_tokens += batch * k
