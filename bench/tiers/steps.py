"""`kvmesh bench tiers --step-overhead`: what offloads cost a real engine's steps.

Three real engines on one model, side by side in one run: ``none`` (a device pool only: its
evictions just drop), ``sync`` (a CPU tier, every offload completing before the step's
forward: the data plane before write-behind) and ``write-behind`` (a CPU tier, offloads
copied out behind the step, the forward waiting layer by layer only for the blocks it
overwrites). Every step is the same work on each: ``batch`` fresh prompts of
``prompt_tokens`` prefilled (one token out), in a pool that holds one step's blocks and a
few more, so each step's allocation evicts the blocks the step before cached: with a CPU
tier, every one of them is offloaded. The engines take turns step by step (none, sync,
write-behind, none, ...) so the host's noise falls on all three alike; the step time is the
wall time of ``Engine.step()``, scheduling and copies included.

``kv_scale`` multiplies the model's KV heads (and attention heads): the same tiny model with
more KV per token of compute, to bring the copy's share of a step near a GPU's (on an H100
an offloaded block costs about a tenth of the prefill that computed it; on a CPU, where
compute is slow and memcpy fast, far less).

See docs/architecture.md#write-behind-offloads.
"""
from __future__ import annotations

import dataclasses
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

MODES = ("none", "sync", "write-behind")


@dataclass
class ModeResult:
    """One engine's steps: wall times (s), the part of them spent executing copy orders
    (``copy_s``: the whole offload when synchronous, handing it to the lane when
    write-behind), blocks offloaded, forward waits for copies."""

    mode: str
    step_s: list[float] = field(default_factory=list)
    copy_s: float = 0.0
    offloaded: int = 0
    waits: int = 0
    wait_s: float = 0.0

    @property
    def mean_s(self) -> float:
        return statistics.fmean(self.step_s)

    @property
    def median_s(self) -> float:
        return statistics.median(self.step_s)

    @property
    def stall_share(self) -> float:
        """The share of the step the copies held it: executing the orders plus the
        forward's waits, over the mean step."""
        return (self.copy_s + self.wait_s) / sum(self.step_s) if self.step_s else 0.0

    def overhead(self, base: ModeResult) -> float:
        """How much longer this mode's steps are than ``base``'s (0.1 = 10%): the median
        of the ratios of the steps that ran side by side (the same turn), so that a burst
        of load on the host, which slows all the turn's steps, cancels out."""
        return statistics.median(a / b for a, b in zip(self.step_s, base.step_s,
                                                        strict=True)) - 1

    def summary(self, base: ModeResult) -> dict[str, object]:
        n = len(self.step_s)
        return {"mode": self.mode, "steps": n, "mean_step_ms": round(self.mean_s * 1e3, 3),
                "median_step_ms": round(self.median_s * 1e3, 3),
                "overhead_vs_none": round(self.overhead(base), 4),
                "offloaded_blocks_per_step": round(self.offloaded / n, 1),
                "copy_orders_ms_per_step": round(self.copy_s / n * 1e3, 3),
                "stall_share": round(self.stall_share, 4),
                "forward_waits_per_step": round(self.waits / n, 2),
                "forward_wait_ms_per_step": round(self.wait_s / n * 1e3, 3)}


def model(kv_scale: int = 1):
    """The tiny model, with ``kv_scale`` times its KV heads (and attention heads)."""
    import torch

    from worker.model import TINY, load_model
    from worker.model.config import ModelConfig
    from worker.model.llama import LlamaModel
    from worker.model.loader import TINY_CONFIG, TINY_INIT_STD, TINY_SEED, init_random

    if kv_scale == 1:
        return load_model(TINY)
    raw = dict(TINY_CONFIG, num_key_value_heads=TINY_CONFIG["num_key_value_heads"] * kv_scale,
               num_attention_heads=TINY_CONFIG["num_attention_heads"] * kv_scale)
    cfg = ModelConfig.from_dict(raw)
    m = LlamaModel(cfg).to(torch.float32).eval()
    m.requires_grad_(False)
    init_random(m, TINY_SEED, TINY_INIT_STD)
    return m, cfg


def measure(model_and_config, *, block_size: int = 16, batch: int = 8,
            prompt_tokens: int = 128, steps: int = 60, warmup: int = 3,
            cpu_x: float = 4.0, link_us_per_block: float = 0.0,
            tick: Callable[[], None] | None = None) -> list[ModeResult]:
    """Run ``steps`` measured steps (after ``warmup``) on each mode's engine, taking turns
    step by step; returns one result per mode, :data:`MODES` order. ``link_us_per_block``
    (> 0) emulates a slower link: each offloaded block's copy takes that much longer (a
    sleep, which holds no core and no GIL, as a DMA transfer would not), in the copy path of
    each mode: before the forward when synchronous, on the lane, layer by layer, when
    write-behind."""
    from worker import Engine
    from worker.engine.scheduler import SchedulerConfig
    from worker.engine.sequence import SamplingParams

    mdl, cfg = model_and_config
    per_req = -(-prompt_tokens // block_size)
    pool = batch * per_req + 2  # one step's blocks: the next step evicts them all
    sched = SchedulerConfig(max_batched_tokens=max(2048, batch * prompt_tokens),
                            max_seqs=max(64, batch))
    engines = {}
    for mode in MODES:
        cpu = round(pool * cpu_x) if mode != "none" else 0
        engines[mode] = Engine(mdl, cfg, block_size=block_size, num_blocks=pool,
                               scheduler=sched, cpu_blocks=cpu or None,
                               write_behind=mode == "write-behind")
    results = {m: ModeResult(m) for m in MODES}
    rng = random.Random(0)
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    vocab = cfg.vocab_size

    copy_s = dict.fromkeys(MODES, 0.0)
    for mode, e in engines.items():
        if e.copies is not None:
            e.copies.execute = _timed(e.copies.execute, copy_s, mode)
            if link_us_per_block > 0:
                _slow_link(e.copies, link_us_per_block * 1e-6)

    def one_step(e) -> float:
        for _ in range(batch):  # fresh prompts: nothing hits, every block is new
            e.add_request([rng.randrange(vocab) for _ in range(prompt_tokens)], params)
        t0 = time.perf_counter()
        e.step()
        dt = time.perf_counter() - t0
        while e.has_work():  # (nothing left: one step prefills the whole batch)
            e.step()
        return dt

    try:
        for e in engines.values():
            for _ in range(warmup):
                one_step(e)
        base = {m: _counters(e) for m, e in engines.items()}
        copy_s.update(dict.fromkeys(MODES, 0.0))
        for _ in range(steps):  # turn by turn, so the host's noise falls on all alike
            for mode, e in engines.items():
                results[mode].step_s.append(one_step(e))
                if tick is not None:
                    tick()
        for mode, e in engines.items():
            off, waits, wait_s = (a - b for a, b in zip(_counters(e), base[mode], strict=True))
            results[mode] = dataclasses.replace(results[mode], offloaded=off, waits=waits,
                                                wait_s=wait_s, copy_s=copy_s[mode])
    finally:
        for e in engines.values():
            e.close()
    return [results[m] for m in MODES]


def _slow_link(copies, s_per_block: float) -> None:
    """Add ``s_per_block`` to every offloaded block's copy (see :func:`measure`)."""
    if copies.behind is not None:
        lane = copies.behind
        copy_layer = lane.copy_layer

        def slow_layer(layer, blocks, slots) -> None:
            time.sleep(s_per_block * len(blocks) / lane.layers)
            copy_layer(layer, blocks, slots)

        lane.copy_layer = slow_layer
    else:
        offload = copies._offload

        def slow(batch) -> None:
            time.sleep(s_per_block * len(batch))
            offload(batch)

        copies._offload = slow


def _timed(execute: Callable, into: dict[str, float], mode: str) -> Callable:
    def timed(orders) -> None:
        t0 = time.perf_counter()
        try:
            execute(orders)
        finally:
            into[mode] += time.perf_counter() - t0
    return timed


def _counters(engine) -> tuple[int, int, float]:
    """(blocks offloaded, forward layers that waited, seconds they waited) so far."""
    gpu = engine.kv.tier_stats()["gpu"]
    behind = engine.copies.behind if engine.copies is not None else None
    if behind is None:
        return gpu.offloads, 0, 0.0
    return gpu.offloads, behind.waits, behind.wait_s


def goal(results: list[ModeResult], limit: float = 0.10) -> tuple[bool, str]:
    """Whether write-behind steps are within ``limit`` of steps without offloads."""
    by = {r.mode: r for r in results}
    none, sync, wb = by["none"], by["sync"], by["write-behind"]
    met = wb.overhead(none) <= limit
    return met, (f"step time vs no offloads: sync {sync.overhead(none):+.1%} (the copies "
                 f"hold the step {sync.stall_share:.1%} of it), write-behind "
                 f"{wb.overhead(none):+.1%} ({wb.stall_share:.1%}); median steps none "
                 f"{none.median_s * 1e3:.1f} ms, sync {sync.median_s * 1e3:.1f} ms, "
                 f"write-behind {wb.median_s * 1e3:.1f} ms")


def report(results: list[ModeResult], title: str, console) -> None:
    """Print the side-by-side table and the goal line."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("mode", "median step", "vs none", "copy orders / step", "forward waits / step",
                "copies hold the step", "offloaded blocks / step"):
        table.add_column(col, justify="left" if col == "mode" else "right")
    base = results[0]
    for r in results:
        n = len(r.step_s)
        table.add_row(r.mode, f"{r.median_s * 1e3:.2f} ms",
                      "" if r is base else f"{r.overhead(base):+.1%}",
                      f"{r.copy_s / n * 1e3:.3f} ms", f"{r.wait_s / n * 1e3:.3f} ms",
                      f"{r.stall_share:.2%}", f"{r.offloaded / n:.0f}")
    console.print(table)
    met, detail = goal(results)
    console.print(f"write-behind within 10% of no offloads: {'MET' if met else 'MISSED'}: "
                  f"{detail}")
