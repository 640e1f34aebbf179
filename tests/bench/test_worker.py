"""The worker micro-benchmark runs and its comparison holds at a small size."""
import pytest

from bench import worker


@pytest.mark.slow
def test_worker_bench_cache_hit_cuts_ttft():
    import torch

    from worker import Engine

    torch.set_num_threads(1)
    engine = Engine.from_pretrained("tiny", block_size=16, num_blocks=128)
    res = worker.ttft_ratio(engine, prompt_len=512, cached=448, repeats=1)
    assert 0 < res["ttft_ratio"] < 1  # 448 of 512 tokens served from cache
