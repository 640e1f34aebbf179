"""Write-behind offloads: the copy executor's ordering rules with copies held in flight, and
the engine's steps over them (identical output, failures reported lost)."""
from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from worker import Engine
from worker.kv_cache.tier_config import TierConfig
from worker.kv_cache.transfers import Lost
from worker.kv_io.copy_executor import CopyExecutor
from worker.kv_io.disk_store import DiskEntry, DiskStore
from worker.model import load_model

SHAPE = (3, 2, 8, 4, 2, 3)  # layers, K/V, blocks, block size, kv heads, head dim
LAYERS = SHAPE[0]
WAIT = 10.0


def h(i: int) -> bytes:
    return bytes([i]) * 32


@pytest.fixture
def cache():
    return torch.randn(SHAPE)


@pytest.fixture
def ex(cache, tmp_path):
    nbytes = cache[:, :, 0].numel() * cache.element_size()
    executor = CopyExecutor(cache, cpu_blocks=3, store=DiskStore(tmp_path, b"f" * 16, nbytes),
                            write_behind=True)
    yield executor
    executor.close()


class Held:
    """The offload lane's copies held until released, layer by layer."""

    def __init__(self, ex: CopyExecutor) -> None:
        self.allowed = threading.Semaphore(0)
        self.copied: list[int] = []
        real = ex.behind.copy_layer

        def held(layer, blocks, slots):
            assert self.allowed.acquire(timeout=WAIT)
            real(layer, blocks, slots)
            self.copied.append(layer)

        ex.behind.copy_layer = held

    def release(self, layers: int = LAYERS) -> None:
        for _ in range(layers):
            self.allowed.release()


def finish(ex: CopyExecutor):
    assert ex.wait(WAIT)
    return ex.poll()


def test_offload_returns_before_its_copy_and_lands_behind(ex, cache):
    held = Held(ex)
    want = cache[:, :, 1].clone()
    ex.offload([(1, 0, h(1))])  # returns although no layer is copied yet
    assert held.copied == [] and not torch.equal(ex.host[0], want)
    held.release()
    assert ex.flush(WAIT) and held.copied == [0, 1, 2]
    assert torch.equal(ex.host[0], want)


def test_an_onboard_reading_a_slot_waits_for_its_offload(ex, cache):
    held = Held(ex)
    want = cache[:, :, 1].clone()
    ex.offload([(1, 0, h(1))])
    ex.onboard("r", [("cpu", 0, 5)])
    assert not ex.wait(0.2)  # the slot is not written yet: the onboard waits
    held.release()
    [done] = finish(ex)
    assert done.ok and torch.equal(cache[:, :, 5], want)


def test_an_onboard_into_a_block_being_copied_out_waits(ex, cache):
    ex.offload([(3, 2, h(3))])
    assert ex.flush(WAIT)
    held = Held(ex)
    want_out, want_in = cache[:, :, 1].clone(), cache[:, :, 3].clone()
    ex.offload([(1, 0, h(1))])  # block 1 is evicted, and reused by the onboard below
    ex.onboard("r", [("cpu", 2, 1)])
    assert not ex.wait(0.2)
    held.release()
    [done] = finish(ex)
    assert done.ok
    assert torch.equal(ex.host[0], want_out)   # copied out before it was overwritten
    assert torch.equal(cache[:, :, 1], want_in)


def test_a_spill_of_a_slot_waits_for_its_offload(ex, cache):
    held = Held(ex)
    want = cache[:, :, 1].clone()
    ex.offload([(1, 0, h(1))])
    spill = threading.Thread(target=ex.spill, args=(0, DiskEntry(h(1), None, (1,) * 4, None)))
    spill.start()
    spill.join(0.2)
    assert spill.is_alive()  # it would copy a slot the offload has not written yet
    held.release()
    spill.join(WAIT)
    assert not spill.is_alive()
    ex.offload([(2, 0, h(2))])  # the slot is reused: the spill copied its bytes already
    ex.onboard("r", [("disk", h(1), 6)])
    [done] = finish(ex)
    assert done.ok and torch.equal(cache[:, :, 6], want)
    assert ex.take_lost() == []


def test_the_forward_waits_layer_by_layer_only_for_blocks_it_writes(ex, cache):
    held = Held(ex)
    ex.offload([(1, 0, h(1))])
    assert ex.gate([4, 7]) is cache  # a step not writing block 1 never waits
    got: list[int] = []
    layers = ex.gate([4, 1])

    def forward() -> None:  # as the model iterates it: layer by layer, the cache's own
        for i, t in enumerate(layers):
            got.append(i if t.data_ptr() == cache[i].data_ptr() else -1)

    step = threading.Thread(target=forward)
    step.start()
    held.release(1)  # layer 0 copied: the forward may write layer 0, not layer 1
    deadline = time.monotonic() + WAIT
    while len(got) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert got == [0] and held.copied == [0]
    held.release(LAYERS - 1)
    step.join(WAIT)
    assert got == [0, 1, 2] and ex.behind.waits >= 1
    assert ex.gate([1]) is cache  # copied: nothing to wait for any more


def test_a_failed_background_offload_is_lost_and_its_slot_unreadable(ex, cache):
    real = ex.behind.copy_layer

    def broken(layer, blocks, slots):
        if layer == 1:
            raise RuntimeError("DMA (injected)")
        real(layer, blocks, slots)

    ex.behind.copy_layer = broken
    ex.offload([(1, 0, h(1)), (2, 1, h(2))])  # no exception here: it fails behind
    assert ex.flush(WAIT)
    assert ex.take_lost() == [Lost("cpu", h(1), 0), Lost("cpu", h(2), 1)]
    assert ex.gate([1, 2]) is cache  # a failed copy holds no step
    ex.spill(0, DiskEntry(h(1), None, (1,) * 4, None))  # a bad slot never reaches disk
    assert ex.take_lost() == [Lost("disk", h(1))]
    ex.onboard("r", [("cpu", 1, 5)])
    [done] = finish(ex)
    assert not done.ok and done.failed == {("cpu", h(2))}
    ex.behind.copy_layer = real
    ex.offload([(3, 1, h(3))])  # a good offload makes the slot readable again
    ex.onboard("s", [("cpu", 1, 5)])
    assert finish(ex)[0].ok and torch.equal(cache[:, :, 5], cache[:, :, 3])


def test_a_failed_batch_leaves_alone_a_slot_a_later_offload_rewrote(ex, cache):
    held = Held(ex)
    real = ex.behind.copy_layer
    calls = []

    def first_fails(layer, blocks, slots):
        calls.append(blocks.tolist())
        if len(calls) == 1:
            raise RuntimeError("DMA (injected)")
        real(layer, blocks, slots)

    ex.behind.copy_layer = first_fails
    ex.offload([(1, 0, h(1))])
    ex.offload([(2, 0, h(2))])  # the manager dropped h(1) and reused its slot
    held.release(2 * LAYERS)
    assert ex.flush(WAIT)
    assert ex.take_lost() == [Lost("cpu", h(1), 0)]  # the manager ignores it: other slot
    ex.onboard("r", [("cpu", 0, 5)])
    assert finish(ex)[0].ok and torch.equal(cache[:, :, 5], cache[:, :, 2])


# --- the engine -----------------------------------------------------------------------

BS = 4


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


def engine(tiny, write_behind: bool = True, num_blocks: int = 8, **tiers) -> Engine:
    model, config = tiny
    return Engine(model, config, block_size=BS, num_blocks=num_blocks,
                  tiers=TierConfig(cpu_blocks=32, **tiers), write_behind=write_behind)


def prompts(seed: int, n: int, length: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(0, 256) for _ in range(length)] for _ in range(n)]


A, B, C = prompts(1, 3, 24)


def run(e: Engine, p: list[int]):
    return e.generate([p], 4, ignore_eos=True)[0]


def test_a_step_reusing_a_block_being_copied_out_waits_for_the_copy(tiny):
    """Slow copies: B's prefill reuses A's evicted blocks while they are still being copied
    out. Had the forward not waited, the CPU tier would hold B's KV under A's hashes and A,
    onboarded back, would decode something else."""
    want = engine(tiny, num_blocks=64).generate([A], 4, ignore_eos=True)[0].token_ids
    e = engine(tiny)
    real = e.copies.behind.copy_layer

    def slow(layer, blocks, slots):
        time.sleep(0.02)
        real(layer, blocks, slots)

    e.copies.behind.copy_layer = slow
    run(e, A)
    run(e, B)  # evicts A's blocks, and writes B's KV into them
    run(e, C)
    assert e.copies.behind.waits > 0  # some layer did wait for its copy
    got = run(e, A)
    assert got.cached_tokens_by_tier["cpu"] > 0 and got.token_ids == want
    e.close()


def test_a_failed_write_behind_offload_is_reported_and_forgotten(tiny):
    from kvmesh.events.pool import PoolRemoved, PoolStored

    want = engine(tiny, num_blocks=64).generate([A], 4, ignore_eos=True)[0].token_ids
    e = engine(tiny)
    real = e.copies.behind.copy_layer

    def broken(layer, blocks, slots):
        raise RuntimeError("DMA (injected)")

    e.copies.behind.copy_layer = broken
    run(e, A)
    e.kv.take_events()
    run(e, B)  # evicts A's blocks: their copy fails behind the step, the step does not
    e.copies.flush(WAIT)
    e.settle_copies()  # (the later steps of B's run may have told the manager already)
    events = e.kv.take_events()

    def cpu(kind):
        return {x for ev in events if isinstance(ev, kind) and ev.tier == "cpu"
                for x in ev.block_hashes}

    assert cpu(PoolStored) and cpu(PoolRemoved) == cpu(PoolStored)  # announced, withdrawn
    assert "cpu" not in e.kv.cached_block_hashes().by_tier()
    e.copies.behind.copy_layer = real
    got = run(e, A)
    assert got.token_ids == want and got.cached_tokens_by_tier["cpu"] == 0
    assert e.kv.num_free_blocks == e.kv.num_blocks
    e.close()


def test_output_is_the_same_with_and_without_write_behind(tiny, tmp_path):
    """Shared prefixes, a pool far too small, a CPU tier spilling to disk: every output
    equal between the synchronous and the write-behind engine, and tiers really used."""
    heads = prompts(7, 4, 16)
    rng = random.Random(3)
    batch = [rng.choice(heads) + [rng.randrange(256) for _ in range(rng.randrange(1, 9))]
             for _ in range(24)]
    outs, lower = {}, {}
    for wb in (False, True):
        e = engine(tiny, wb, num_blocks=12, disk_blocks=32, disk_dir=tmp_path / str(wb))
        done = [e.generate([p], 3, ignore_eos=True)[0] for p in batch]
        outs[wb] = [c.token_ids for c in done]
        lower[wb] = sum(c.cached_tokens_by_tier["cpu"] + c.cached_tokens_by_tier["disk"]
                        for c in done)
        e.close()
    assert outs[True] == outs[False]
    assert lower[True] > 0 and lower[False] > 0
