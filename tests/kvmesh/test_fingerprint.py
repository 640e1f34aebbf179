"""kvmesh.contract.kv_fingerprint: every input of the KV bytes names another fingerprint;
equal inputs give equal bytes whatever the order they were written in."""
from __future__ import annotations

import pytest

from kvmesh.contract import FINGERPRINT_BYTES, kv_fingerprint

CONFIG = {"num_hidden_layers": 2, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
          "max_position_embeddings": 2048,
          "rope_scaling": {"rope_type": "default", "factor": 1.0}, "eos_token_ids": (2,)}
BASE = dict(architecture="LlamaForCausalLM", dtype="torch.float32", block_size=16,
            hash_algo="sha256_cbor", root_hash=b"r" * 32, weight_sample=b"w" * 64)


def fp(config=CONFIG, **kw) -> bytes:
    return kv_fingerprint(config, **{**BASE, **kw})


def test_deterministic_and_independent_of_key_order():
    assert len(fp()) == FINGERPRINT_BYTES
    assert fp() == fp(dict(reversed(list(CONFIG.items()))))
    assert fp() == fp({**CONFIG, "eos_token_ids": [2]})  # tuples are JSON arrays


@pytest.mark.parametrize("field, value", [
    ("rope_theta", 500000.0), ("rms_norm_eps", 1e-5), ("max_position_embeddings", 8192),
    ("rope_scaling", {"rope_type": "linear", "factor": 4.0}), ("num_hidden_layers", 3),
    ("a_field_added_later", True)])
def test_any_config_field_changes_it(field, value):
    assert fp({**CONFIG, field: value}) != fp()


@pytest.mark.parametrize("arg, value", [
    ("architecture", "Qwen2ForCausalLM"), ("dtype", "torch.bfloat16"), ("block_size", 8),
    ("hash_algo", "xxhash"), ("root_hash", b"s" * 32), ("weight_sample", b"w" * 63 + b"x")])
def test_every_other_input_changes_it(arg, value):
    assert fp(**{arg: value}) != fp()


def test_bad_input_is_refused():
    with pytest.raises(TypeError):
        fp({**CONFIG, "rope_scaling": object()})
    with pytest.raises(ValueError, match="block_size"):
        fp(block_size=0)
