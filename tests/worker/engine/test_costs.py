"""The cost meter: EWMAs of measured prefill and onboard costs, and the start calibration."""
from __future__ import annotations

import pytest

from worker.engine.costs import ALPHA, CALIBRATION_TOKENS, CostMeter


def test_prefill_counts_only_steps_that_prefill_a_block():
    m = CostMeter(block_size=16)
    m.step(num_tokens=8, num_prefill_tokens=0, seconds=1.0)   # decodes only
    m.step(num_tokens=20, num_prefill_tokens=15, seconds=1.0)  # under a block of prefill
    assert m.load()["prefill_us_per_token"] == 0.0
    m.step(num_tokens=40, num_prefill_tokens=32, seconds=0.004)
    assert m.load()["prefill_us_per_token"] == pytest.approx(100.0)
    m.step(num_tokens=512, num_prefill_tokens=512, seconds=0.1024)  # 200 us/token
    assert m.prefill_us_per_token == pytest.approx((1 - ALPHA) * 100 + ALPHA * 200)
    before = m.prefill_us_per_token
    m.step(num_tokens=16, num_prefill_tokens=16, seconds=0.016)  # small: weighs 1/16
    alpha = ALPHA * 16 / CALIBRATION_TOKENS
    assert m.prefill_us_per_token == pytest.approx((1 - alpha) * before + alpha * 1000)


def test_onboard_per_tier():
    m = CostMeter(block_size=16)
    m.onboard("cpu", 4, 0.0004)
    m.onboard("disk", 0, 1.0)  # nothing landed: no sample
    assert m.load() == {"prefill_us_per_token": 0.0, "onboard_us_per_block_cpu":
                        pytest.approx(100.0), "onboard_us_per_block_disk": 0.0,
                        "fetch_us_per_block": 0.0, "fetch_us_per_call": 0.0}
    m.onboard("disk", 2, 0.002)
    assert m.load()["onboard_us_per_block_disk"] == pytest.approx(1000.0)


def test_fetch_costs_are_ewmas_of_the_call_and_the_pull_per_block():
    m = CostMeter(block_size=16)
    m.fetch(4, 0.002, 0.004)  # the first sample is taken as is
    assert m.load()["fetch_us_per_call"] == pytest.approx(2000.0)
    assert m.load()["fetch_us_per_block"] == pytest.approx(1000.0)
    m.fetch(0, 0.001, 0.0)  # nothing landed: the per-block figure keeps its value
    assert m.load()["fetch_us_per_block"] == pytest.approx(1000.0)
    assert m.load()["fetch_us_per_call"] == pytest.approx((1 - ALPHA) * 2000 + ALPHA * 1000)
