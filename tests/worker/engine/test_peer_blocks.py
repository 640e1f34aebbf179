"""The engine's side of a peer fetch: a source's snapshot of the blocks it holds (any tier)
imported by another engine gives greedy output identical to transformers' and to recompute,
counted as "peer" tokens; what is not held or cannot be hit is not imported."""
from __future__ import annotations

import random

import pytest
import torch

from kvmesh.events.pool import PoolStored
from kvmesh.hashing import block_hashes
from tests.worker.hf_models import VOCAB, make_hf_model
from worker import Engine
from worker.engine.peer_blocks import import_landed, layout, snapshot
from worker.engine.sequence import SamplingParams, SeqStatus
from worker.kv_cache.tier_config import TierConfig
from worker.model import load_model

BS = 4
N_OUT = 8


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    return make_hf_model("LlamaForCausalLM", path), path


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


def prompt_of(seed: int, length: int, vocab: int = VOCAB) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(length)]


def hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                      pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


def fetch_and_run(src: Engine, dst: Engine, prompt: list[int], start: int = 0):
    """Snapshot the chain from ``start`` on ``src``, import it into ``dst`` right after
    enqueueing the prompt there (as the worker does), and run it: (seq, imported blocks)."""
    hashes = block_hashes(prompt, BS, algo=dst.kv.hash_algo, seed=dst.kv.hash_seed)
    snap = snapshot(src, hashes[start:])
    seq = dst.enqueue(list(prompt), SamplingParams(max_tokens=N_OUT, ignore_eos=True))
    data = bytearray(snap.data.reshape(-1).view(torch.uint8).numpy().tobytes())
    n = import_landed(dst, seq.req, start, data, snap.count)
    while seq.status is not SeqStatus.FINISHED:
        dst.step()
    return seq, n


def test_fetched_prefix_output_equals_transformers_and_recompute(checkpoint):
    hf, path = checkpoint
    prompt = prompt_of(1, 6 * BS + 3)
    src = Engine.from_pretrained(path, block_size=BS, num_blocks=64)
    dst = Engine.from_pretrained(path, block_size=BS, num_blocks=64)
    local = src.generate([prompt], N_OUT, ignore_eos=True)[0]
    seq, n = fetch_and_run(src, dst, prompt)
    assert n == 6
    assert seq.cached_tokens_by_tier == {"gpu": 0, "cpu": 0, "disk": 0, "peer": 6 * BS}
    assert seq.num_cached_tokens == 6 * BS
    want = hf_greedy(hf, prompt, N_OUT)
    assert seq.output_ids == want == local.token_ids
    # Now an ordinary device block of dst: a second request hits it as "gpu".
    again = dst.generate([prompt], N_OUT, ignore_eos=True)[0]
    assert again.cached_tokens_by_tier == {"gpu": 6 * BS, "cpu": 0, "disk": 0}
    assert again.token_ids == want


def test_blocks_from_the_source_cpu_and_disk_tiers(tiny, tmp_path):
    model, config = tiny
    src = Engine(model, config, block_size=BS, num_blocks=10,
                 tiers=TierConfig(cpu_blocks=2, disk_blocks=16, disk_dir=tmp_path / "d"))
    prompt = prompt_of(2, 6 * BS + 1, 256)
    want = src.generate([prompt], N_OUT, ignore_eos=True)[0].token_ids
    for seed in (3, 4):  # push the prompt down to the CPU and disk tiers
        src.generate([prompt_of(seed, 6 * BS, 256)], N_OUT, ignore_eos=True)
    hashes = block_hashes(prompt, BS, algo=src.kv.hash_algo, seed=src.kv.hash_seed)
    snap = snapshot(src, hashes)
    assert snap.count == 6 and snap.tiers.get("disk", 0) + snap.tiers.get("cpu", 0) > 0
    assert snap.token_ids == prompt[:6 * BS]
    dst = Engine(model, config, block_size=BS, num_blocks=64)
    seq, n = fetch_and_run(src, dst, prompt)
    assert n == 6 and seq.cached_tokens_by_tier["peer"] == 6 * BS
    assert seq.output_ids == want
    src.close()


def test_receiver_imports_only_beyond_what_it_holds_and_announces_them(tiny):
    model, config = tiny
    src = Engine(model, config, block_size=BS, num_blocks=64)
    dst = Engine(model, config, block_size=BS, num_blocks=64)
    prompt = prompt_of(5, 8 * BS + 2, 256)
    want = src.generate([prompt], N_OUT, ignore_eos=True)[0].token_ids
    dst.generate([prompt[:3 * BS + 1]], 1)  # dst holds blocks 0..2 itself
    dst.kv.take_events()
    seq, n = fetch_and_run(src, dst, prompt, start=2)  # the plan overlaps what dst holds
    assert n == 5  # blocks 3..7
    assert seq.cached_tokens_by_tier == {"gpu": 3 * BS, "cpu": 0, "disk": 0, "peer": 5 * BS}
    assert seq.output_ids == want
    stored = [e for e in dst.kv.take_events() if isinstance(e, PoolStored)]
    hashes = block_hashes(prompt, BS, algo=dst.kv.hash_algo, seed=dst.kv.hash_seed)
    assert stored[0].block_hashes == hashes[3:8] and stored[0].parent_hash == hashes[2]
    assert stored[0].token_ids == prompt[3 * BS:8 * BS]


def test_a_gap_before_the_fetched_range_imports_nothing(tiny):
    model, config = tiny
    src = Engine(model, config, block_size=BS, num_blocks=64)
    dst = Engine(model, config, block_size=BS, num_blocks=64)
    prompt = prompt_of(6, 6 * BS + 1, 256)
    want = src.generate([prompt], N_OUT, ignore_eos=True)[0].token_ids
    seq, n = fetch_and_run(src, dst, prompt, start=2)  # dst holds nothing of blocks 0, 1
    assert n == 0 and "peer" not in seq.cached_tokens_by_tier
    assert seq.output_ids == want


def test_a_source_that_evicted_the_chain_serves_the_run_it_still_holds(tiny):
    model, config = tiny
    src = Engine(model, config, block_size=BS, num_blocks=10)
    prompt = prompt_of(7, 6 * BS + 1, 256)
    want = src.generate([prompt], N_OUT, ignore_eos=True)[0].token_ids
    hashes = block_hashes(prompt, BS, algo=src.kv.hash_algo, seed=src.kv.hash_seed)
    src.generate([prompt_of(8, 6 * BS, 256)], N_OUT, ignore_eos=True)  # evicts the tail
    snap = snapshot(src, hashes)
    assert 0 < snap.count < 6
    dst = Engine(model, config, block_size=BS, num_blocks=64)
    seq, n = fetch_and_run(src, dst, prompt)
    assert n == snap.count and seq.output_ids == want
    src.generate([prompt_of(9, 7 * BS, 256)], N_OUT, ignore_eos=True)  # evicts it all
    assert snapshot(src, hashes).count == 0


def test_a_failed_write_caches_nothing(tiny, monkeypatch):
    model, config = tiny
    src = Engine(model, config, block_size=BS, num_blocks=64)
    dst = Engine(model, config, block_size=BS, num_blocks=64)
    prompt = prompt_of(10, 5 * BS + 1, 256)
    src.generate([prompt], 1)
    hashes = block_hashes(prompt, BS, algo=src.kv.hash_algo, seed=src.kv.hash_seed)
    snap = snapshot(src, hashes)
    seq = dst.enqueue(list(prompt), SamplingParams(max_tokens=1))
    short = bytearray(layout(dst).block_bytes)  # one block's bytes for five: the view fails
    with pytest.raises(RuntimeError):
        import_landed(dst, seq.req, 0, short, snap.count)
    assert dst.kv.pool.num_cached_blocks == 0
    assert dst.kv.num_free_blocks == dst.kv.num_blocks
