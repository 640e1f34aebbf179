"""The recompute side of `kvmesh bench transfer`: block sizes from the model shape, and a
measured (not assumed) prefill cost that grows with the model."""
from __future__ import annotations

import pytest

from bench.recompute import MODELS, block_bytes, prefill_us_per_token


def test_a_blocks_bytes_follow_the_kv_shape() -> None:
    assert block_bytes(MODELS["tiny"], 16) == 4 * 2 * 2 * 32 * 16 * 4  # 32 KiB
    assert block_bytes(MODELS["8-layer"], 16) == 8 * 2 * 4 * 64 * 16 * 4  # 256 KiB
    assert block_bytes(MODELS["8-layer"], 32, dtype_bytes=2) == block_bytes(MODELS["8-layer"], 16)


@pytest.mark.slow
def test_the_8_layer_model_costs_more_per_token_than_tiny() -> None:
    tiny = prefill_us_per_token(MODELS["tiny"], 64, 16, repeats=2)
    eight = prefill_us_per_token(MODELS["8-layer"], 64, 16, repeats=2)
    assert 0 < tiny < eight
