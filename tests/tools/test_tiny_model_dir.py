"""``python -m tools.tiny_model_dir DIR``: one directory the worker, the gateway and the
benchmark tools' ``AutoTokenizer`` all load, with one vocabulary."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.tiny_model_dir import SPECIALS, write_model_dir
from worker.model_source import check_model_source


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("tiny") / "kvmesh-tiny", vocab_size=600)


def test_the_worker_loads_it_with_the_tokenizer_vocabulary(model_dir: Path):
    import torch

    from worker.model import load_model

    check_model_source(str(model_dir))
    model, cfg = load_model(model_dir, device="cpu")
    assert cfg.vocab_size == 600
    ids = torch.tensor([0, 5, 599])
    assert model.embed_tokens(ids).shape == (3, cfg.hidden_size)


def test_the_gateway_and_transformers_count_the_same_tokens(model_dir: Path):
    from transformers import AutoTokenizer

    from client.gateway.tokenizer import load_tokenizer

    text = "The kvmesh gateway routes each request to the worker holding its prefix."
    ours = load_tokenizer(str(model_dir)).encode(text)
    theirs = AutoTokenizer.from_pretrained(str(model_dir))(text).input_ids
    assert ours == theirs and ours[0] == SPECIALS.index("<s>")
    assert len(ours) < len(text.encode())  # merges: a BPE, not one token per byte
    config = json.loads((model_dir / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (0, 1)


def test_the_same_arguments_write_the_same_weights(model_dir: Path, tmp_path: Path):
    again = write_model_dir(tmp_path / "again", vocab_size=600)
    assert (again / "model.safetensors").read_bytes() == (
        model_dir / "model.safetensors").read_bytes()
