"""Tiny random Hugging Face checkpoints (no downloads) shared by the model and engine tests."""
from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 320


def hf_config(arch: str, **overrides):
    """A small random-model config with GQA (4 heads / 2 kv heads), fp32, eager attention."""
    import transformers  # imported on use: seconds that every test run would pay at collection

    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.2,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    common.update(overrides)
    cls = {
        "LlamaForCausalLM": transformers.LlamaConfig,
        "Qwen2ForCausalLM": transformers.Qwen2Config,
        "MistralForCausalLM": transformers.MistralConfig,
    }[arch]
    if arch == "MistralForCausalLM":
        common.setdefault("sliding_window", None)
    cfg = cls(**common)
    cfg._attn_implementation = "eager"
    return cfg


def make_hf_model(arch: str, path: Path, seed: int = 0, **overrides):
    """Build a seeded random HF model (norms and biases randomized too) and save it."""
    import transformers

    torch.manual_seed(seed)
    model_cls = getattr(transformers, arch)
    model = model_cls(hf_config(arch, **overrides)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.2)
    model.save_pretrained(path)
    return model
