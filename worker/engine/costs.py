"""Measured costs: what a token of prefill and an onboarded block cost on this worker.

The router credits a lower-tier prefix match by what it really saves here:
``1 - onboard_us_per_block / (block_size * prefill_us_per_token)`` (the service computes
it). So the worker reports, with its load, these figures in microseconds:

- ``prefill_us_per_token``: wall time of the steps that prefilled at least a block of
  tokens, divided by the tokens they computed (decode-only steps say nothing about it);
- ``onboard_us_per_block_cpu`` / ``_disk``: wall time of the copies that brought blocks back
  from that tier, per block (the calibration reads its disk block cold, past the page
  cache; live reads may hit the page cache and pull the average down);
- ``fetch_us_per_call`` / ``fetch_us_per_block``: a peer fetch's control call (to its
  header) and its pull per block landed, measured live only (the router's
  ``service.policy.fetch`` defaults stand in until then).

Each is an exponentially weighted moving average of live measurements, seeded by a short
calibration at start (:func:`calibrate`) when a lower tier is enabled. 0.0 means unknown.
"""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

import torch

from kvmesh.contract import LOWER_TIERS

if TYPE_CHECKING:
    from worker.kv_io.copy_executor import CopyExecutor

ALPHA = 0.2          # weight of a new sample: a few dozen steps forget a calibration
CALIBRATION_TOKENS = 256
CALIBRATION_REPS = 3


class CostMeter:
    """EWMAs of the measured costs (see the module docstring); engine thread only."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.prefill_us_per_token = 0.0
        self.onboard_us_per_block = dict.fromkeys(LOWER_TIERS, 0.0)
        self.fetch_us_per_call = 0.0   # peer fetches (receiver): control call
        self.fetch_us_per_block = 0.0  # and per block pulled

    @staticmethod
    def _mix(old: float, sample: float, weight: float = 1.0) -> float:
        alpha = ALPHA * weight
        return sample if old == 0.0 else (1 - alpha) * old + alpha * sample

    def step(self, num_tokens: int, num_prefill_tokens: int, seconds: float) -> None:
        """A step computed ``num_tokens`` tokens, ``num_prefill_tokens`` of them in
        prefills, in ``seconds``; counted only when a block's worth was prefill, and
        weighted by its size (a small step's fixed costs say little per token)."""
        if num_prefill_tokens >= self.block_size and num_tokens > 0:
            self.prefill_us_per_token = self._mix(
                self.prefill_us_per_token, seconds * 1e6 / num_tokens,
                min(1.0, num_tokens / CALIBRATION_TOKENS))

    def onboard(self, tier: str, blocks: int, seconds: float) -> None:
        """``blocks`` blocks came back from ``tier`` in ``seconds``."""
        if blocks > 0:
            self.onboard_us_per_block[tier] = self._mix(self.onboard_us_per_block[tier],
                                                        seconds * 1e6 / blocks)

    def fetch(self, blocks: int, call_s: float, pull_s: float) -> None:
        """A peer fetch: its control call (ticket check and the source's read) took
        ``call_s``, then ``blocks`` blocks landed in ``pull_s``."""
        self.fetch_us_per_call = self._mix(self.fetch_us_per_call, call_s * 1e6)
        if blocks > 0:
            self.fetch_us_per_block = self._mix(self.fetch_us_per_block,
                                                pull_s * 1e6 / blocks)

    def load(self) -> dict[str, float]:
        """The ``WorkerLoad`` fields."""
        return {"prefill_us_per_token": self.prefill_us_per_token,
                "onboard_us_per_block_cpu": self.onboard_us_per_block["cpu"],
                "onboard_us_per_block_disk": self.onboard_us_per_block["disk"],
                "fetch_us_per_block": self.fetch_us_per_block,
                "fetch_us_per_call": self.fetch_us_per_call}


def _best_of(reps: int, fn, before=None) -> float:
    """The fastest of ``reps`` timed runs after one untimed warm-up (seconds); ``before``
    runs, untimed, ahead of each."""
    fn()
    best = float("inf")
    for _ in range(reps):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _drop_page_cache(path: os.PathLike) -> None:
    """Make the next read of ``path`` come from the device, not the page cache, where the
    system allows it: the disk tier's cost is that of a cold block (pessimistic)."""
    if hasattr(os, "posix_fadvise"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _copy_in(executor: CopyExecutor, tier: str, src: int | bytes) -> None:
    executor.copy_in(tier, src, 0)
    executor.sync()


def calibrate(meter: CostMeter, model: torch.nn.Module, cache: torch.Tensor,
              executor: CopyExecutor, max_tokens: int) -> None:
    """Seed ``meter`` with one prefill of up to ``CALIBRATION_TOKENS`` tokens and one block
    copied back from each enabled tier. Runs at start, on a pool nobody uses yet: it
    writes the first blocks of ``cache`` and zeroes them again afterwards (never-written
    blocks must stay finite), and a disk block file it deletes again."""
    from worker.kv_io.disk_store import DiskEntry
    from worker.model import AttentionMetadata

    bs = meter.block_size
    num_blocks = cache.shape[2]
    n_blocks = min(max(1, min(CALIBRATION_TOKENS, max_tokens) // bs), num_blocks)
    n = n_blocks * bs
    table = list(range(n_blocks))
    dev = cache.device
    try:
        ids = torch.randint(0, model.config.vocab_size, (n,), device=dev)

        def prefill() -> None:
            meta = AttentionMetadata.build([(table, 0, n)], bs, dev)
            hidden = model(ids, meta.positions, meta, cache)
            model.compute_logits(hidden[meta.last_token_indices]).tolist()  # syncs a GPU

        meter.prefill_us_per_token = _best_of(CALIBRATION_REPS, prefill) * 1e6 / n
        if executor.host is not None:
            executor.host[0].zero_()
            meter.onboard_us_per_block["cpu"] = _best_of(
                CALIBRATION_REPS, lambda: _copy_in(executor, "cpu", 0)) * 1e6
        if executor.store is not None:
            key = b"\x00kvmesh-calibration"
            zeros = torch.zeros(executor.block_shape, dtype=cache.dtype)
            executor.store.write(DiskEntry(key, None, (), None),
                                 zeros.reshape(-1).view(torch.uint8).numpy())
            path = executor.store.path(key)
            try:
                meter.onboard_us_per_block["disk"] = _best_of(
                    CALIBRATION_REPS, lambda: _copy_in(executor, "disk", key),
                    before=lambda: _drop_page_cache(path)) * 1e6
            finally:
                executor.store.delete(key)
    finally:
        cache[:, :, :n_blocks].zero_()
