"""The copy executor alone: offload, spill, onboard and their ordering, with injected faults."""
from __future__ import annotations

import threading

import pytest
import torch

from worker.kv_io.copy_executor import CopyExecutor
from worker.kv_io.disk_store import DiskEntry, DiskStore

SHAPE = (2, 2, 8, 4, 2, 3)  # layers, K/V, blocks, block size, kv heads, head dim
WAIT = 10.0


def h(i: int) -> bytes:
    return bytes([i]) * 32


def entry(i: int) -> DiskEntry:
    return DiskEntry(h(i), None, (i, i, i, i), None)


@pytest.fixture
def cache():
    return torch.randn(SHAPE)


@pytest.fixture
def ex(cache, tmp_path):
    nbytes = cache[:, :, 0].numel() * cache.element_size()
    executor = CopyExecutor(cache, cpu_blocks=3, store=DiskStore(tmp_path, b"f" * 16, nbytes))
    yield executor
    executor.close()


def finish(ex: CopyExecutor):
    assert ex.wait(WAIT)
    return ex.poll()


def test_offload_then_onboard_round_trips(ex, cache):
    want = cache[:, :, [1, 2]].clone()
    ex.offload([(1, 0, h(1)), (2, 2, h(2))])
    cache[:, :, 1:3] = 0  # the device blocks are reused
    ex.onboard("r", [("cpu", 0, 5), ("cpu", 2, 6)])
    assert ex.onboarding("r")
    [done] = finish(ex)
    assert (done.request_id, done.ok, done.failed) == ("r", True, set())
    assert done.blocks == {"cpu": 2} and done.seconds["cpu"] >= 0
    assert not ex.onboarding()
    assert torch.equal(cache[:, :, [5, 6]], want)


def test_spill_then_onboard_from_disk_sees_the_write(ex, cache):
    want = cache[:, :, 3].clone()
    ex.offload([(3, 1, h(3))])
    ex.spill(1, entry(3))
    ex.offload([(4, 1, h(4))])  # the slot is reused at once: the spill copied its bytes
    ex.onboard("r", [("disk", h(3), 7), ("cpu", 1, 6)])  # no flush: FIFO orders it
    [done] = finish(ex)
    assert done.ok and done.blocks == {"disk": 1, "cpu": 1}
    assert torch.equal(cache[:, :, 7], want)
    assert torch.equal(cache[:, :, 6], cache[:, :, 4])
    assert ex.store.path(h(3)).exists()


def test_spill_of_a_slot_holding_another_block_writes_nothing(ex):
    ex.offload([(3, 1, h(3))])
    ex.spill(1, entry(9))
    assert ex.flush(WAIT)
    assert not ex.store.path(h(9)).exists()


def test_delete_is_ordered_after_the_write(ex):
    ex.offload([(3, 1, h(3))])
    ex.spill(1, entry(3))
    ex.delete(h(3))
    assert ex.flush(WAIT)
    assert not ex.store.path(h(3)).exists()


def test_a_read_waits_for_the_pending_write_of_its_block(ex, cache, monkeypatch):
    gate = threading.Event()
    write = ex.store.write
    monkeypatch.setattr(ex.store, "write", lambda *a: (gate.wait(WAIT), write(*a)))
    ex.offload([(3, 1, h(3)), (1, 0, h(1))])
    ex.spill(1, entry(3))
    ex.onboard("r", [("cpu", 0, 5)])  # not behind the slow write: another thread
    [done] = finish(ex)
    assert done.ok
    ex.onboard("s", [("disk", h(3), 7)])
    assert not ex.wait(0.1)  # waits for the write of its file
    gate.set()
    [done] = finish(ex)
    assert done.ok and torch.equal(cache[:, :, 7], cache[:, :, 3])


def test_a_damaged_file_fails_the_onboard_and_leaves_the_block_alone(ex, cache):
    ex.offload([(3, 1, h(3))])
    ex.spill(1, entry(3))
    assert ex.flush(WAIT)
    path = ex.store.path(h(3))
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    before = cache[:, :, 7].clone()
    ex.onboard("r", [("cpu", 1, 6), ("disk", h(3), 7)])
    [done] = finish(ex)
    assert not done.ok and done.failed == {("disk", h(3))} and done.blocks == {"cpu": 1}
    assert torch.equal(cache[:, :, 7], before)
    assert not path.exists()


def test_an_injected_failure_stops_the_onboard_at_that_copy(ex):
    ex.offload([(1, 0, h(1)), (2, 1, h(2))])
    calls = []
    real = ex.copy_in

    def failing(tier, src, block_id):
        calls.append(block_id)
        if block_id == 5:
            raise RuntimeError("DMA error (injected)")
        real(tier, src, block_id)

    ex.copy_in = failing
    ex.onboard("r", [("cpu", 0, 5), ("cpu", 1, 6)])
    [done] = finish(ex)
    assert not done.ok and done.failed == {("cpu", h(1))} and calls == [5]
    ex.copy_in = real  # the executor serves on
    ex.onboard("s", [("cpu", 1, 6)])
    assert finish(ex)[0].ok


def test_a_failed_offload_makes_its_slots_unreadable(ex, cache, monkeypatch):
    ex.offload([(1, 0, h(1))])

    def broken(copies):
        raise RuntimeError("copy failed (injected)")

    monkeypatch.setattr(ex, "_offload", broken)
    with pytest.raises(RuntimeError):
        ex.offload([(2, 0, h(2))])
    monkeypatch.undo()
    ex.spill(0, entry(2))  # a bad slot is never written to disk either
    ex.onboard("r", [("cpu", 0, 5)])
    [done] = finish(ex)
    assert not done.ok and done.failed == {("cpu", h(2))}  # named: the manager drops it
    assert not ex.store.path(h(2)).exists()
    ex.offload([(2, 0, h(2))])  # a good offload makes the slot readable again
    ex.onboard("s", [("cpu", 0, 5)])
    assert finish(ex)[0].ok and torch.equal(cache[:, :, 5], cache[:, :, 2])


def test_a_slow_copy_is_reported_only_when_done(ex, cache):
    ex.offload([(1, 0, h(1))])
    gate = threading.Event()
    started = threading.Event()
    real = ex.copy_in

    def slow(*args):
        started.set()
        assert gate.wait(WAIT)
        real(*args)

    ex.copy_in = slow
    ex.onboard("r", [("cpu", 0, 5)])
    assert started.wait(WAIT)
    assert ex.poll() == [] and ex.onboarding("r") and not ex.wait(0.01)
    gate.set()
    [done] = finish(ex)
    assert done.ok and torch.equal(cache[:, :, 5], cache[:, :, 1])


def test_close_finishes_pending_writes(ex):
    ex.offload([(1, 0, h(1)), (2, 1, h(2))])
    ex.spill(0, entry(1))
    ex.spill(1, entry(2))
    ex.close()
    assert sorted(e.block_hash for e in ex.store.scan()) == [h(1), h(2)]


def test_spills_wait_for_a_slow_disk_instead_of_piling_up(ex, monkeypatch):
    import worker.kv_io.copy_executor as kv_transfer

    monkeypatch.setattr(kv_transfer, "MAX_QUEUED", 2)
    gate = threading.Event()
    write = ex.store.write
    monkeypatch.setattr(ex.store, "write", lambda *a: (gate.wait(WAIT), write(*a)))
    ex.offload([(1, 0, h(1)), (2, 1, h(2)), (3, 2, h(3))])
    ex.spill(0, entry(1))  # the writer is stuck in it
    ex.spill(1, entry(2))  # 2 jobs: at the limit
    third = threading.Thread(target=ex.spill, args=(2, entry(3)))
    third.start()
    third.join(0.2)
    assert third.is_alive()  # waits for the writer rather than queue a third copy
    gate.set()
    third.join(WAIT)
    assert not third.is_alive() and ex.flush(WAIT)
    assert sorted(e.block_hash for e in ex.store.scan()) == [h(1), h(2), h(3)]
