"""Llama-family decoder over a paged KV cache, its loader and tokenizers.

Per engine step::

    meta = AttentionMetadata.build(
        [(block_table, num_computed_tokens, num_new_tokens), ...], block_size, device
    )
    hidden = model(input_ids, meta.positions, meta, kv_cache)   # input_ids: [T] new tokens
    logits = model.compute_logits(hidden[meta.last_token_indices])  # [S, vocab], fp32

with ``model, config = load_model("tiny" | dir)`` and
``kv_cache = model.allocate_kv_cache(num_blocks, block_size)``.
"""

from worker.model.attention import AttentionMetadata, paged_attention, write_kv
from worker.model.config import SUPPORTED_ARCHITECTURES, ModelConfig, RopeScaling
from worker.model.llama import LlamaModel
from worker.model.loader import (
    TINY,
    TINY_BOS,
    TINY_CONFIG,
    TINY_EOS,
    TINY_PAD,
    default_device,
    default_dtype,
    load_model,
)
from worker.model.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "TINY",
    "TINY_BOS",
    "TINY_CONFIG",
    "TINY_EOS",
    "TINY_PAD",
    "AttentionMetadata",
    "ByteTokenizer",
    "HFTokenizer",
    "LlamaModel",
    "ModelConfig",
    "RopeScaling",
    "Tokenizer",
    "default_device",
    "default_dtype",
    "load_model",
    "load_tokenizer",
    "paged_attention",
    "write_kv",
]
