"""What recomputing a block costs: prefill time per token on this CPU, with the worker's own
model runtime, for the tiny model and an 8-layer one (`kvmesh bench transfer`).

The 8-layer model is built the way ``tiny`` is (``worker.model.loader``: seeded random
weights, no download): tiny's architecture (byte vocabulary, 2:1 grouped-query attention,
MLP 3x the width) at 8 layers, hidden 512, 8 heads of 64. Its KV is 16 KiB a token in fp32,
so about 40x more KV bytes per FLOP than Llama-3-8B in bf16 (128 KiB a token for ~16 GFLOP):
a fetch that pays off here pays off more on real models.

See docs/benchmarks.md#peer-kv-transfer-kvmesh-bench-transfer.
"""
from __future__ import annotations

import time
from typing import Any

from worker.model import TINY_CONFIG

MODELS: dict[str, dict[str, Any]] = {
    "tiny": dict(TINY_CONFIG),
    "8-layer": dict(TINY_CONFIG, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                    num_attention_heads=8, num_key_value_heads=4, head_dim=64),
}


def block_bytes(config: dict[str, Any], block_size: int, dtype_bytes: int = 4) -> int:
    """Bytes of one block's KV: layers x (K, V) x kv heads x head dim x tokens x dtype."""
    return (config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * config["head_dim"]
            * block_size * dtype_bytes)


def prefill_us_per_token(config: dict[str, Any], tokens: int, block_size: int,
                         repeats: int = 3, threads: int = 1) -> float:
    """Best-of-``repeats`` wall time of one ``tokens``-token prefill (after a warm-up), per
    token, in microseconds: fp32 on CPU, as the worker runs without a GPU, on ``threads``
    torch threads (1 by default: on a shared machine, OpenMP threads that wait for busy cores
    make a prefill 10-30x slower and the figure meaningless)."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _prefill_us_per_token(config, tokens, block_size, repeats)
    finally:
        torch.set_num_threads(saved)


def _prefill_us_per_token(config: dict[str, Any], tokens: int, block_size: int,
                          repeats: int) -> float:
    import torch

    from worker.model import AttentionMetadata, LlamaModel, ModelConfig
    from worker.model.loader import TINY_INIT_STD, TINY_SEED, init_random

    cfg = ModelConfig.from_dict(config)
    with torch.device("meta"):
        model = LlamaModel(cfg)
    model = model.to(torch.float32).to_empty(device="cpu")
    model.tie_weights()
    model.eval().requires_grad_(False)
    init_random(model, TINY_SEED, TINY_INIT_STD)
    n_blocks = -(-tokens // block_size)
    cache = model.allocate_kv_cache(n_blocks, block_size, device="cpu")
    ids = torch.randint(0, cfg.vocab_size, (tokens,), generator=torch.Generator().manual_seed(0))
    table = list(range(n_blocks))

    def prefill() -> None:
        meta = AttentionMetadata.build([(table, 0, tokens)], block_size, torch.device("cpu"))
        hidden = model(ids, meta.positions, meta, cache)
        model.compute_logits(hidden[meta.last_token_indices]).tolist()

    prefill()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        prefill()
        best = min(best, time.perf_counter() - t0)
    return best * 1e6 / tokens
