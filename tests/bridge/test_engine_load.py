"""An engine's load from vLLM's /metrics page: per rank, estimates, silence, the shared scrape."""
from __future__ import annotations

import asyncio

import pytest

from bridge.engine_load import LoadSource, Scraper, parse_load
from tests.bridge.fake_metrics import FakeMetrics
from tests.ports import closed_port_address


def page(ranks: int = 2, **load) -> str:
    fake = FakeMetrics(model="org/model", ranks=ranks, num_blocks=1000, block_size=16)
    try:
        for rank in fake.load:
            for k, v in load.items():
                setattr(rank, k, v)
        fake.load[-1].running += 5
        return fake.page()
    finally:
        fake.stop()


def test_each_rank_reads_its_own_samples() -> None:
    text = page(running=2, waiting=3, usage=0.25, prompts=4, prompt_tokens=400)
    r0, r1 = parse_load(text, 0, block_size=16), parse_load(text, 1, block_size=16)
    assert (r0.running, r1.running) == (2, 7)
    assert (r0.waiting, r0.total_blocks, r0.free_blocks) == (3, 1000, 750)
    assert r0.decode_tokens == 250 * 16           # blocks in use x block size
    assert r0.queued_prefill_tokens == 3 * 100    # waiting x mean prompt
    assert (r0.model, r0.block_size) == ("org/model", 16)
    assert parse_load(text, 2) is None            # no such rank: silent


def test_a_page_without_ranks_serves_rank_0_and_older_names() -> None:
    text = ('vllm:num_requests_running{model_name="m"} 1\n'
            'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n')
    load = parse_load(text, 0, num_blocks=64, block_size=4)
    assert (load.running, load.total_blocks, load.free_blocks, load.decode_tokens) == (
        1, 64, 32, 128)
    assert parse_load(text, 0).total_blocks == 0  # unknown pool: the free-block guard is off


def test_pages_without_the_engine_are_silent() -> None:
    assert parse_load("") is None
    assert parse_load("vllm:num_requests_waiting 3\n") is None
    with pytest.raises(ValueError):
        parse_load("vllm:num_requests_running{engine=0 oops\n")


def test_the_scrape_is_shared_and_failures_are_none() -> None:
    async def main():
        fake = FakeMetrics(ranks=2)
        try:
            scraper = Scraper(f"{fake.url}/metrics", timeout=2.0)
            a, b = LoadSource(scraper, 0), LoadSource(scraper, 1)
            got = await asyncio.gather(a.sample(max_age=30), b.sample(max_age=30))
            assert all(got) and fake.requests == 1
            fake.fail = True  # 503
            assert await a.sample(max_age=0) is None and scraper.failures == 1
            fake.fail = False
            assert await a.sample(max_age=0) is not None
        finally:
            fake.stop()
        gone = LoadSource(Scraper(f"http://{closed_port_address()}/metrics", timeout=2.0))
        assert await gone.sample(max_age=0) is None  # connection refused
    asyncio.run(main())


def test_a_hostile_page_still_gives_a_load_the_service_accepts() -> None:
    text = ('vllm:num_requests_running{engine="0"} +Inf\n'
            'vllm:num_requests_waiting{engine="0"} -5\n'
            'vllm:kv_cache_usage_perc{engine="0"} 7.5\n'
            'vllm:cache_config_info{engine="0",num_gpu_blocks="99999999999999"} 1\n'
            'vllm:request_prompt_tokens_sum{engine="0"} 1e300\n'
            'vllm:request_prompt_tokens_count{engine="0"} 1e-300\n')
    load = parse_load(text, 0, block_size=16)
    pb = load.proto()  # within every field's range
    assert pb.running == 0 and pb.waiting == 0 and pb.total_blocks == 2**32 - 1
    assert pb.free_blocks == 0 <= pb.total_blocks
