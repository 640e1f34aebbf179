"""The micro-benchmarks run and their comparisons hold at a small size."""
import pytest

from bench import hashing, worker


def test_hashing_bench_is_byte_identical_and_reports_ratios():
    rows = hashing.run(num_tokens=256, block_size=16, repeats=2)
    assert [r["algo"] for r in rows] == ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]
    assert all(r["blocks"] == 16 and r["speedup"] > 0 for r in rows)


@pytest.mark.slow
def test_worker_bench_cache_hit_cuts_ttft():
    import torch

    from worker import Engine

    torch.set_num_threads(1)
    engine = Engine.from_pretrained("tiny", block_size=16, num_blocks=128)
    res = worker.ttft_ratio(engine, prompt_len=512, cached=448, repeats=1)
    assert 0 < res["ttft_ratio"] < 1  # 448 of 512 tokens served from cache
