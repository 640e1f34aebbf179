"""worker.model.fingerprint: a loaded model's fingerprint covers its whole parsed config
(rope_theta, rope_scaling, rms_norm_eps and max_position_embeddings included), its weights, dtype,
block size, hash algorithm and root hash."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from worker.model import load_model
from worker.model.config import ModelConfig
from worker.model.fingerprint import model_fingerprint
from worker.model.loader import TINY_CONFIG


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


def fp(model, cfg, block_size=16, algo="sha256_cbor", root=b"r" * 32) -> bytes:
    return model_fingerprint(model, cfg, block_size, model.dtype, algo, root)


def test_models_seeds_and_block_sizes_apart(tiny):
    model, cfg = tiny
    base = fp(model, cfg)
    assert base == fp(model, cfg)
    assert base != fp(model, cfg, block_size=8)
    assert base != fp(model, cfg, root=b"s" * 32)
    assert base != fp(model, cfg, algo="xxhash")
    other, _ = load_model("tiny")
    with torch.no_grad():
        other.layers[0].self_attn.qkv_proj.weight[0, 0] += 1.0
    assert base != fp(other, cfg)


@pytest.mark.parametrize("edit", [
    {"rope_theta": 500000.0},
    {"rms_norm_eps": 1e-5},
    {"max_position_embeddings": TINY_CONFIG.get("max_position_embeddings", 2048) * 4},
    {"rope_scaling": {"rope_type": "linear", "factor": 4.0}},
], ids=lambda e: next(iter(e)))
def test_an_edited_config_json_changes_it(tiny, edit):
    model, cfg = tiny
    edited = ModelConfig.from_dict({**TINY_CONFIG, **edit})
    assert edited != cfg  # the edit reached the parsed config
    assert fp(model, edited) != fp(model, cfg)


def test_the_architecture_is_covered(tiny):
    model, cfg = tiny
    assert fp(model, dataclasses.replace(cfg, architecture="MistralForCausalLM")) != fp(
        model, cfg)
