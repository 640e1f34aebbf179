"""The copy executor: moves KV blocks between the device pool, host memory and disk files.

It owns the host-memory tier and the disk store and runs the manager's orders so that a step
never reads a block whose copy is not done: ``offload`` has completed (for the next forward)
when it returns, or, write-behind, runs behind the step and the forward iterates ``gate``
(``worker.kv_io.write_behind``); ``spill`` copies the slot out at once and writes the file
in the background; ``onboard`` is asynchronous (``poll`` returns the finished ones); every
copy that did not happen is reported by ``take_lost``. Not thread-safe: call everything but
``copy_in`` from the engine thread.

See docs/architecture.md#worker-data-plane.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from worker.kv_cache.transfers import Drop, Lost, Offload, Onboard, Spill, Transfer
from worker.kv_io.disk_store import DiskEntry, DiskStore
from worker.kv_io.lane import Lane
from worker.kv_io.write_behind import WriteBehind

log = logging.getLogger("kvmesh.worker.kv_transfer")

MAX_QUEUED = 256  # background jobs (mostly pending disk writes, a block copy each) at most


@dataclass
class OnboardDone:
    """A finished onboard: ``ok`` when every copy landed. ``failed`` names the lower-tier
    copies that could not be read, as ``(tier, block_hash)``; ``blocks`` / ``seconds`` count
    the copies per tier that did land and their wall time (for the cost meter)."""

    request_id: str
    ok: bool
    failed: set[tuple[str, bytes]] = field(default_factory=set)
    blocks: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


class CopyExecutor:
    """Executes the manager's copy orders over ``cache`` (``[layers, 2, blocks, ...]``).

    ``cpu_blocks``: host slots (0: no host tier); ``store``: the disk tier (None: none);
    ``write_behind``: offloads run behind the step (the forward must iterate :meth:`gate`)
    instead of completing before ``offload`` returns."""

    def __init__(self, cache: torch.Tensor, cpu_blocks: int, store: DiskStore | None, *,
                 write_behind: bool = False) -> None:
        self.cache = cache
        self.cuda = cache.device.type == "cuda"
        self.block_shape = (cache.shape[0], cache.shape[1], *cache.shape[3:])
        self.block_nbytes = cache[:, :, 0].numel() * cache.element_size()
        self.host = _host_slots(cpu_blocks, self.block_shape, cache.dtype, self.cuda)
        self.store = store
        self.stream = torch.cuda.Stream(cache.device) if self.cuda else None
        self._slot_hash: dict[int, bytes] = {}     # what each host slot holds
        self._bad: set[int] = set()  # host slots whose offload failed half-way
        self._slot_ready: dict[int, torch.cuda.Event] = {}  # CUDA: offload still copying
        self._staging: list[torch.Tensor] = []  # CUDA: pinned reads of in-flight copies
        self._cv = threading.Condition()  # guards the lanes' counts, _done, _writing, _lost
        self._reads = Lane("kvmesh-kv-onboard", self._cv)
        self._writes = Lane("kvmesh-kv-spill", self._cv)
        self.behind = (WriteBehind(cache, self.host, self._cv, self._offload_failed)
                       if write_behind and self.host is not None else None)
        self._writing: dict[bytes, int] = {}  # hash -> its writes not finished yet
        self._done: deque[OnboardDone] = deque()
        self._onboarding: set[str] = set()  # request ids submitted, not yet polled
        self._lost: list[Lost] = []  # copies that did not happen, not yet taken

    # --- orders ---------------------------------------------------------------------

    def execute(self, orders: Sequence[Transfer]) -> None:
        """Carry out ``manager.take_transfers()``, in order (consecutive offloads batched).
        Every order is attempted even when one raises (an ``Onboard`` left unsubmitted
        would hold its request forever); the first error is raised at the end, so the
        step fails and the half-written host slots are never read."""
        error: BaseException | None = None
        batch: list[tuple[int, int, bytes]] = []
        for order in [*orders, None]:
            if isinstance(order, Offload):
                batch.append((order.block_id, order.slot, order.block_hash))
                continue
            try:
                self.offload(batch)
            except Exception as e:
                error = error or e
            batch = []
            try:
                if isinstance(order, Spill):
                    self.spill(order.cpu_slot, DiskEntry(
                        order.block_hash, order.parent_hash, order.token_ids,
                        order.extra_keys))
                elif isinstance(order, Onboard):
                    self.onboard(order.request_id, order.copies)
                elif isinstance(order, Drop):
                    self.delete(order.block_hash)
            except Exception as e:
                error = error or e
                if isinstance(order, Onboard):  # never started: it ends, failed, at once
                    self._finished(OnboardDone(order.request_id, ok=False))
        if error is not None:
            raise error

    def offload(self, copies: Sequence[tuple[int, int, bytes]]) -> None:
        """Copy device blocks into host slots: ``(block_id, slot, block_hash)`` each; with
        write-behind, start copying them (a failure on the lane is reported lost)."""
        if not copies:
            return
        try:
            if self.behind is not None:
                with self._cv:
                    for _, slot, block_hash in copies:
                        self._bad.discard(slot)
                        self._slot_hash[slot] = block_hash
                self.behind.submit(copies)
                return
            self._offload(copies)
        except BaseException:
            with self._cv:
                for _, slot, block_hash in copies:  # half-written: reading them must fail
                    self._slot_hash[slot] = block_hash  # (named, so the manager drops them)
                    self._bad.add(slot)
            self._report([Lost("cpu", h, slot) for _, slot, h in copies])
            raise
        for _, slot, block_hash in copies:
            self._bad.discard(slot)
            self._slot_hash[slot] = block_hash

    def _offload_failed(self, base: int, copies: Sequence[tuple[int, int, bytes]]) -> None:
        """A write-behind batch failed (offload lane, under ``_cv``): its slots that no later
        offload rewrites are unreadable, and every copy of it is reported lost."""
        for _, slot, _ in copies:
            if self.behind.latest(slot, base):
                self._bad.add(slot)
        self._lost += [Lost("cpu", h, slot) for _, slot, h in copies]

    def gate(self, written: Iterable[int]) -> torch.Tensor | Iterable[torch.Tensor]:
        """The cache as the forward writing device blocks ``written`` must iterate it:
        the cache itself, unless a write-behind offload still reads one of them."""
        return self.cache if self.behind is None else self.behind.gate(written)

    def _offload(self, copies: Sequence[tuple[int, int, bytes]]) -> None:
        if self.cuda:
            compute = torch.cuda.current_stream(self.cache.device)
            self.stream.wait_stream(compute)  # the blocks' KV was written on compute
            with torch.cuda.stream(self.stream):
                for block_id, slot, _ in copies:
                    self.host[slot].copy_(self.cache[:, :, block_id], non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(self.stream)
            compute.wait_event(ev)  # the forward that reuses these blocks runs after
            for _, slot, _ in copies:
                self._slot_ready[slot] = ev
        else:
            for block_id, slot, _ in copies:
                self.host[slot].copy_(self.cache[:, :, block_id])

    def spill(self, slot: int, entry: DiskEntry) -> None:
        """Write host slot ``slot`` (holding ``entry``) to its disk file. The bytes are
        copied now; the file is written in the background."""
        try:
            ev = self._slot_ready.pop(slot, None)
            if ev is not None:
                ev.synchronize()
            if self.behind is not None:
                self.behind.wait_slot(slot)
            with self._cv:
                bad = slot in self._bad or self._slot_hash.get(slot) != entry.block_hash
            if bad:
                # never written: the manager drops the disk entry it announced (take_lost)
                log.warning("spill of host slot %d: it does not hold a good copy of %s; "
                            "not written", slot, entry.block_hash.hex()[:16])
                self._report([Lost("disk", entry.block_hash)])
                return
            data = self.host[slot].clone()
        except BaseException:  # no write queued: no file will exist
            self._report([Lost("disk", entry.block_hash)])
            raise
        with self._cv:  # a disk slower than the evictions: wait rather than pile copies up
            self._cv.wait_for(lambda: self._writes.queued < MAX_QUEUED)
            self._writing[entry.block_hash] = self._writing.get(entry.block_hash, 0) + 1
        self._writes.submit(lambda: self._write(entry, data))

    def _write(self, entry: DiskEntry, data: torch.Tensor) -> None:
        ok = False
        try:
            self.store.write(entry, _bytes(data))
            ok = True
        finally:
            with self._cv:
                n = self._writing.pop(entry.block_hash) - 1
                if n:
                    self._writing[entry.block_hash] = n
                elif not ok:  # no later write of this hash will make the file
                    self._lost.append(Lost("disk", entry.block_hash))
                self._cv.notify_all()

    def delete(self, block_hash: bytes) -> None:
        """Delete a disk block's file (after every write and read ordered before)."""
        self._writes.submit(lambda: self.store.delete(block_hash))

    def onboard(self, request_id: str, copies: Sequence[tuple[str, int | bytes, int]]) -> None:
        """Start copying ``(tier, slot or block hash, device block id)`` each, in order;
        :meth:`poll` reports the end. The slots and files must stay put until then (the
        manager's readers count guarantees it)."""
        self._onboarding.add(request_id)
        copies = list(copies)
        if self.cuda:
            self.stream.wait_stream(torch.cuda.current_stream(self.cache.device))
        self._reads.submit(lambda: self._finished(self._onboard(request_id, copies)))

    # --- completion -----------------------------------------------------------------

    def _report(self, lost: list[Lost]) -> None:
        with self._cv:
            self._lost += lost

    def take_lost(self) -> list[Lost]:
        """The copies that did not happen since the last call (for
        ``KVCacheManager.copies_lost``), oldest first."""
        with self._cv:
            out, self._lost = self._lost, []
        return out

    def poll(self) -> list[OnboardDone]:
        """Onboards finished since the last call, in the order they finished."""
        with self._cv:
            out = list(self._done)
            self._done.clear()
        for d in out:
            self._onboarding.discard(d.request_id)
        return out

    def onboarding(self, request_id: str | None = None) -> bool:
        """Whether an onboard (of ``request_id``, or any) is submitted and not yet polled."""
        return request_id in self._onboarding if request_id is not None else bool(
            self._onboarding)

    def wait(self, timeout: float) -> bool:
        """Block until an onboard finished and is ready to poll (True) or ``timeout``."""
        with self._cv:
            return self._cv.wait_for(lambda: bool(self._done), timeout)

    def flush(self, timeout: float | None = None) -> bool:
        """Block until every submitted job (writes included) has run; False on timeout."""
        if self.behind is not None and not self.behind.flush(timeout):
            return False
        with self._cv:
            return self._cv.wait_for(
                lambda: self._reads.queued == 0 and self._writes.queued == 0, timeout)

    @property
    def running(self) -> bool:
        """Whether a background thread is alive (False once closed)."""
        return self._reads.alive or self._writes.alive or (
            self.behind is not None and self.behind.lane.alive)

    def close(self, timeout: float = 30.0) -> None:
        """Finish the queued jobs (pending file writes) and stop the threads."""
        if self.behind is not None:
            self.behind.lane.close(timeout)
        self._reads.close(timeout)
        self._writes.close(timeout)

    # --- the background threads -----------------------------------------------------

    def _finished(self, done: OnboardDone) -> None:
        with self._cv:
            self._done.append(done)
            self._cv.notify_all()

    def _onboard(self, request_id: str, copies: list[tuple[str, int | bytes, int]]) -> OnboardDone:
        """Run one onboard's copies in order; stop at the first that fails. Consecutive
        copies from one tier form a group, timed from its first copy to its end (on CUDA,
        the side stream's synchronisation)."""
        done = OnboardDone(request_id, ok=True)
        group: str | None = None
        count, t0 = 0, time.perf_counter()
        for tier, src, block_id in copies:
            if tier != group:
                self._end_group(done, group, count, t0)
                group, count, t0 = tier, 0, time.perf_counter()
            try:
                self.copy_in(tier, src, block_id)
            except Exception as e:  # the request recomputes; the bad copy is dropped
                key = src if isinstance(src, bytes) else self._slot_hash.get(src, b"")
                log.warning("onboard of %s from %s failed (%s): recomputing",
                            request_id, tier, e)
                done.ok = False
                done.failed.add((tier, key))
                break
            count += 1
        self._end_group(done, group, count, t0)
        return done

    def _end_group(self, done: OnboardDone, tier: str | None, count: int, t0: float) -> None:
        self.sync()
        if tier is not None and count:
            done.blocks[tier] = done.blocks.get(tier, 0) + count
            done.seconds[tier] = done.seconds.get(tier, 0.0) + time.perf_counter() - t0

    def sync(self) -> None:
        """Wait until every copy issued by :meth:`copy_in` has landed (CUDA; on a CPU device
        they are done when it returns)."""
        if self.cuda:
            self.stream.synchronize()
            self._staging.clear()

    def copy_in(self, tier: str, src: int | bytes, block_id: int) -> None:
        """Copy one lower-tier block into device block ``block_id`` (background thread;
        tests wrap this to inject slow or failing copies). Raises if the source cannot be
        read. On CUDA the copy is only issued on the side stream: :meth:`sync` waits."""
        dst = self.cache[:, :, block_id]
        if self.behind is not None:  # never overwrite a block, or read a slot, mid-offload
            self.behind.wait_block(block_id, self.stream)
            if tier == "cpu":
                self.behind.wait_slot(src, self.stream)
        if tier == "cpu":
            with self._cv:
                bad = src in self._bad
            if bad:
                raise RuntimeError(f"host slot {src} was not written (its offload failed)")
            with self._on_side_stream():
                dst.copy_(self.host[src], non_blocking=self.cuda)
        elif tier == "disk":
            with self._cv:  # its file may still be on its way to disk
                self._cv.wait_for(lambda: src not in self._writing)
            if self.cuda:
                staging = torch.empty(self.block_shape, dtype=self.cache.dtype, pin_memory=True)
                self.store.read(src, _bytes(staging))
                self._staging.append(staging)  # alive until the copy from it has landed
                with self._on_side_stream():
                    dst.copy_(staging, non_blocking=True)
            else:
                buf = self.store.read(src)
                dst.copy_(torch.frombuffer(buf, dtype=torch.uint8).view(self.cache.dtype)
                          .view(self.block_shape))
        else:
            raise ValueError(f"unknown tier {tier!r}")

    def read_block(self, tier: str, src: int | bytes) -> torch.Tensor:
        """A host copy of one lower-tier block (a peer fetch's source read; engine thread,
        between steps, so the slot or file stays put while read). Raises if it cannot be
        read (an offload that failed, a damaged file: reported lost, so it is dropped)."""
        if tier == "cpu":
            if self.behind is not None:  # a write-behind offload into it may be in flight
                self.behind.wait_slot(src)
            ev = self._slot_ready.pop(src, None)
            if ev is not None:
                ev.synchronize()
            if src in self._bad:
                raise RuntimeError(f"host slot {src} was not written (its offload failed)")
            return self.host[src].clone()
        with self._cv:  # its file may still be on its way to disk
            self._cv.wait_for(lambda: src not in self._writing)
        try:
            buf = self.store.read(src)
        except Exception:
            self._report([Lost("disk", src)])
            raise
        return torch.frombuffer(buf, dtype=torch.uint8).view(
            self.cache.dtype).view(self.block_shape)

    def _on_side_stream(self) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext()


def _host_slots(n: int, shape: tuple[int, ...], dtype: torch.dtype,
                pinned: bool) -> torch.Tensor | None:
    """``n`` host slots; pinned for a CUDA device (asynchronous copies) when the system lets
    us pin that much, else pageable (copies then block the side stream, still correct)."""
    if not n:
        return None
    if pinned:
        try:
            return torch.empty((n, *shape), dtype=dtype, pin_memory=True)
        except RuntimeError as e:
            log.warning("cannot pin %d host KV blocks (%s): using pageable memory", n, e)
    return torch.empty((n, *shape), dtype=dtype)


def _bytes(t: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous CPU tensor, shared (no copy)."""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


