"""Write-behind offloads: evicted device blocks copied out to host slots behind the step.

An ``Offload`` order (device block -> host slot) is handed to a background lane and the step
goes on; the lane copies the batch layer by layer (one ``index_select`` + ``index_copy_`` per
layer on CPU, which release the GIL; the copies issued on a side stream, an event per layer,
on CUDA). Nothing that could see a half-copied block proceeds before its copy:

- the forward: the engine hands the model ``gate(written)`` instead of the cache; when a
  block the step writes (a reused block id) is still being copied out, layer ``l`` of the
  cache is handed over only once layer ``l`` of that copy is done, so the copy of the later
  layers overlaps the compute of the earlier ones. A step that writes no such block gets
  the cache itself and never waits;
- a ``Spill`` of a slot and an onboard reading a slot wait for the slot's offload
  (``wait_slot``); an onboard writing a device block waits for the offload reading it
  (``wait_block``): the offload of a block is always ordered before the onboard that
  reuses it.

Progress is one counter of ticks: a batch submitted at tick ``base`` owns ticks
``base + 1 .. base + layers`` and tick ``base + l + 1`` is done when its layer ``l`` is
(issued on its stream, on CUDA: the waiter then waits on that layer's event too). Batches run
in submission order, so waiting for a tick waits for every earlier batch too. A batch that
raises calls ``on_failed(base, copies)`` (the executor marks the slots bad and reports each
copy ``Lost``) and is done: no waiter hangs on it.

See docs/architecture.md#write-behind-offloads.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch

from worker.kv_io.lane import Lane

log = logging.getLogger("kvmesh.worker.kv_transfer")

Copies = Sequence[tuple[int, int, bytes]]  # (device block id, host slot, block hash)


class WriteBehind:
    """The write-behind offload lane over ``cache`` (``[layers, 2, blocks, ...]``) and
    ``host`` (``[slots, layers, 2, ...]``). Engine thread: ``submit``, ``gate``,
    ``wait_slot`` (spills); onboard thread: ``wait_slot`` / ``wait_block``. ``cv`` is the
    executor's (a reentrant condition), so ``on_failed`` may take it."""

    def __init__(self, cache: torch.Tensor, host: torch.Tensor, cv: threading.Condition,
                 on_failed: Callable[[int, Copies], None]) -> None:
        self.cache = cache
        self.host = host
        self.layers = cache.shape[0]
        self.cuda = cache.device.type == "cuda"
        self.stream = torch.cuda.Stream(cache.device) if self.cuda else None
        self.cv = cv
        # One intra-op thread: the copies are memory-bound, and more would only take cores
        # from the forward they run beside (torch's setting is per thread).
        self.lane = Lane("kvmesh-kv-offload", cv, on_start=lambda: torch.set_num_threads(1))
        self.on_failed = on_failed
        self._issued = 0  # ticks handed out
        self._done = 0    # ticks done (batches finish in order)
        self._block_at: dict[int, int] = {}  # device block -> base of the last batch reading it
        self._slot_at: dict[int, int] = {}   # host slot -> base of the last batch writing it
        self._events: dict[int, torch.cuda.Event] = {}  # CUDA: tick -> its layer's copies
        self.waits = 0        # forward layers that had to wait for a copy
        self.wait_s = 0.0     # and how long they waited, in total

    # --- engine thread ----------------------------------------------------------------

    def submit(self, copies: Copies) -> None:
        """Start copying ``copies`` out; returns at once."""
        after = None
        if self.cuda:  # the blocks' KV was written on the compute stream
            after = torch.cuda.Event()
            after.record(torch.cuda.current_stream(self.cache.device))
        with self.cv:
            base = self._issued
            self._issued += self.layers
            for block_id, slot, _ in copies:
                self._block_at[block_id] = base
                self._slot_at[slot] = base
            for tick in [t for t, ev in self._events.items() if ev.query()]:
                del self._events[tick]  # landed: nobody needs to wait on it any more
        copies = list(copies)
        self.lane.submit(lambda: self._run(base, copies, after))

    def latest(self, slot: int, base: int) -> bool:
        """Whether the batch of ``base`` is the last one ordered to write ``slot``."""
        with self.cv:
            return self._slot_at.get(slot) == base

    def gate(self, written: Iterable[int]) -> torch.Tensor | Iterable[torch.Tensor]:
        """What the forward that writes device blocks ``written`` must iterate instead of
        the cache: the cache itself when none of them is being copied out, else
        :class:`Gated` (layer ``l`` once its copies are done)."""
        with self.cv:
            bases = [self._block_at[b] for b in written if b in self._block_at]
            pending = [b for b in bases if self._pending(b)]
        return Gated(self, max(pending)) if pending else self.cache

    # --- any thread -------------------------------------------------------------------

    def wait_slot(self, slot: int, stream: torch.cuda.Stream | None = None) -> None:
        """Return once the last offload into ``slot`` is done (on CUDA: ``stream`` waits
        for it, or the host does when None)."""
        with self.cv:
            base = self._slot_at.get(slot)
        if base is not None:
            self._wait(base + self.layers, stream)

    def wait_block(self, block_id: int, stream: torch.cuda.Stream | None = None) -> None:
        """Return once the last offload reading device block ``block_id`` is done."""
        with self.cv:
            base = self._block_at.get(block_id)
        if base is not None:
            self._wait(base + self.layers, stream)

    def flush(self, timeout: float | None = None) -> bool:
        """Block until every submitted offload is done (landed, on CUDA)."""
        with self.cv:
            if not self.cv.wait_for(lambda: self._done == self._issued, timeout):
                return False
            events = list(self._events.values())
        for ev in events:
            ev.synchronize()
        return True

    def _pending(self, base: int) -> bool:  # under cv
        if base + self.layers > self._done:
            return True
        ev = self._events.get(base + self.layers - 1)
        return ev is not None and not ev.query()

    def _wait(self, tick: int, stream: torch.cuda.Stream | None) -> torch.cuda.Event | None:
        with self.cv:
            self.cv.wait_for(lambda: self._done >= tick)
            ev = self._events.get(tick - 1)
        if ev is not None:
            if stream is None:
                ev.synchronize()
            else:
                stream.wait_event(ev)
        return ev

    # --- the lane ---------------------------------------------------------------------

    def _run(self, base: int, copies: Copies, after: torch.cuda.Event | None) -> None:
        try:  # host-side indices: index_select on CPU, plain ids to copy per block on CUDA
            blocks = torch.tensor([b for b, _, _ in copies], dtype=torch.long)
            slots = torch.tensor([s for _, s, _ in copies], dtype=torch.long)
            if after is not None:
                self.stream.wait_event(after)
            for layer in range(self.layers):
                self.copy_layer(layer, blocks, slots)
                ev = None
                if self.cuda:
                    ev = torch.cuda.Event()
                    ev.record(self.stream)
                with self.cv:
                    if ev is not None:
                        self._events[base + layer + 1] = ev
                    self._done = base + layer + 1
                    self.cv.notify_all()
        except BaseException as e:  # the slots hold garbage: nobody may read them
            log.warning("write-behind offload of %d block(s) failed (%s): dropping them",
                        len(copies), e)
            with self.cv:
                self.on_failed(base, copies)
                self._done = base + self.layers
                self.cv.notify_all()

    def copy_layer(self, layer: int, blocks: torch.Tensor, slots: torch.Tensor) -> None:
        """Copy layer ``layer`` of device blocks ``blocks`` into host slots ``slots`` (the
        lane's thread; tests wrap it to inject slow or failing copies)."""
        if self.cuda:
            with torch.cuda.stream(self.stream):
                for block_id, slot in zip(blocks.tolist(), slots.tolist(), strict=True):
                    self.host[slot, layer].copy_(self.cache[layer, :, block_id],
                                                 non_blocking=True)
        else:
            src = self.cache[layer].index_select(1, blocks)  # [2, n, block, heads, dim]
            self.host[:, layer].index_copy_(0, slots, src.transpose(0, 1))


class Gated:
    """The cache as the model iterates it (``kv_caches[layer]`` in order): each layer is
    handed over once that layer of every offload up to batch ``base`` is done."""

    def __init__(self, wb: WriteBehind, base: int) -> None:
        self.wb = wb
        self.base = base

    def __len__(self) -> int:
        return self.wb.layers

    def __iter__(self) -> Iterator[torch.Tensor]:
        wb = self.wb
        compute = torch.cuda.current_stream(wb.cache.device) if wb.cuda else None
        for layer in range(wb.layers):
            t0 = time.perf_counter()
            with wb.cv:
                ready = wb._done >= self.base + layer + 1
            if not ready or wb.cuda:
                wb._wait(self.base + layer + 1, compute)
                if not ready:
                    wb.waits += 1
                    wb.wait_s += time.perf_counter() - t0
            yield wb.cache[layer]
