"""The source's read beside the step, attacked: it serves what the engine-thread read serves;
a block evicted and overwritten while it is copied is never served (the run ends before it);
a run that goes on in a lower tier is left to the engine thread; and under a stepping
engine that evicts all the time, every block it serves is one the cache really held."""
from __future__ import annotations

import hashlib
import random
import threading

import pytest
import torch

from kvmesh.hashing import block_hashes
from worker import Engine
from worker.engine import peer_read
from worker.engine.peer_blocks import snapshot
from worker.engine.peer_read import read_beside
from worker.engine.sequence import SamplingParams
from worker.kv_cache.tier_config import TierConfig
from worker.model import load_model

BS = 4


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


def prompt_of(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 256) for _ in range(length)]


def chain(engine: Engine, prompt: list[int]) -> list[bytes]:
    return block_hashes(prompt, BS, algo=engine.kv.hash_algo, seed=engine.kv.hash_seed)


def test_it_serves_what_the_engine_thread_read_serves(tiny):
    engine = Engine(*tiny, block_size=BS, num_blocks=64)
    prompt = prompt_of(1, 6 * BS + 1)
    engine.generate([prompt], 2, ignore_eos=True)
    hashes = chain(engine, prompt) + [b"\x01" * 32]  # the last one is held nowhere
    got, want = read_beside(engine, hashes), snapshot(engine, hashes)
    assert got.count == want.count == 6 and got.tiers == want.tiers == {"gpu": 6}
    assert got.token_ids == want.token_ids == prompt[:6 * BS]
    assert torch.equal(got.data, want.data)
    assert read_beside(engine, [b"\x02" * 32]).count == 0


def test_a_block_overwritten_while_it_is_copied_is_never_served(tiny, monkeypatch):
    """Between the copies of blocks 1 and 2, the engine evicts block 2 and a new request
    writes it: the read serves blocks 0 and 1 only, their bytes as cached."""
    engine = Engine(*tiny, block_size=BS, num_blocks=64)
    prompt = prompt_of(2, 4 * BS + 1)
    engine.generate([prompt], 1)
    hashes = chain(engine, prompt)
    want = snapshot(engine, hashes)
    pool, cache = engine.kv.pool, engine.kv_cache
    victim = next(iter(pool.cached[hashes[2]].values()))
    copy = peer_read.copy_block

    def copy_then_overwrite(row, cache_, block_id):
        if block_id == victim.block_id:  # the engine thread wins the race on this block
            pool._drop_hash(victim)
            cache[:, :, block_id] = 7.0
        copy(row, cache_, block_id)

    monkeypatch.setattr(peer_read, "copy_block", copy_then_overwrite)
    got = read_beside(engine, hashes)
    assert got.count == 2 and got.token_ids == prompt[:2 * BS]
    assert torch.equal(got.data, want.data[:2])


def test_a_run_that_goes_on_in_a_lower_tier_is_left_to_the_engine_thread(tiny):
    engine = Engine(*tiny, block_size=BS, num_blocks=10, tiers=TierConfig(cpu_blocks=16))
    prompt = prompt_of(3, 6 * BS + 1)
    engine.generate([prompt], 2, ignore_eos=True)
    for seed in (4, 5):  # push the prompt's blocks down to the CPU tier
        engine.generate([prompt_of(seed, 6 * BS)], 2, ignore_eos=True)
    hashes = chain(engine, prompt)
    assert read_beside(engine, hashes) is None
    assert snapshot(engine, hashes).count == 6
    engine.close()


def test_under_a_stepping_engine_every_served_block_is_one_the_cache_held(tiny):
    """The engine steps on its own thread with a pool so small that every request evicts;
    reads run meanwhile. After each step the engine thread records the digest of every
    cached block's KV under its hash; each block a read serves must match one of them (a
    torn or rewritten copy would not)."""
    engine = Engine(*tiny, block_size=BS, num_blocks=14)
    prompts = [prompt_of(10 + i, 5 * BS + 1) for i in range(6)]
    chains = [chain(engine, p) for p in prompts]
    held: dict[bytes, set[str]] = {}
    lock, stop = threading.Lock(), threading.Event()
    steps = [0]

    def record() -> None:
        cache = engine.kv_cache
        for h, holders in engine.kv.pool.cached.items():
            for block in holders.values():
                digest = hashlib.sha1(cache[:, :, block.block_id].numpy().tobytes()).hexdigest()
                with lock:
                    held.setdefault(h, set()).add(digest)

    def run() -> None:
        rng = random.Random(0)
        while not stop.is_set():
            engine.add_request(list(rng.choice(prompts)), SamplingParams(2, ignore_eos=True))
            while engine.has_work():
                engine.step()
                record()
                steps[0] += 1

    stepper = threading.Thread(target=run, daemon=True)
    stepper.start()
    served, i = 0, 0
    try:
        while steps[0] < 60 or served < 200:  # reads beside many steps, evictions between
            i += 1
            hashes = chains[i % len(chains)]
            snap = read_beside(engine, hashes)
            for n in range(snap.count):
                digest = hashlib.sha1(snap.data[n].numpy().tobytes()).hexdigest()
                with lock:
                    known = held.get(hashes[n], set())
                assert digest in known or _recorded_later(lock, held, hashes[n], digest)
                served += 1
    finally:
        stop.set()
        stepper.join(timeout=30)
    assert engine.kv.pool.evictions > 0  # blocks were reused while reads ran


def _recorded_later(lock: threading.Lock, held: dict, h: bytes, digest: str) -> bool:
    """A block cached by the step in progress is recorded when that step ends."""
    for _ in range(200):
        with lock:
            if digest in held.get(h, set()):
                return True
        threading.Event().wait(0.01)
    return False
