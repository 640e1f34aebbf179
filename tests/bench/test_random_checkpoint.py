"""``bench.random_checkpoint``: a random model of ``bench.recompute.MODELS`` as a checkpoint
directory the worker's loader serves, written once and reused."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.random_checkpoint import checkpoint
from bench.recompute import MODELS


def test_a_written_checkpoint_loads_as_its_config_and_is_reused(tmp_path: Path) -> None:
    from worker import Engine
    from worker.model import load_model

    path = checkpoint("tiny", tmp_path)  # tiny's shape: small enough for a unit test
    written = (path / "model.safetensors").stat().st_mtime_ns
    model, cfg = load_model(str(path), device="cpu")
    want = MODELS["tiny"]
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_key_value_heads) == (
        want["num_hidden_layers"], want["hidden_size"], want["num_key_value_heads"])
    out = Engine(model, cfg, block_size=16, num_blocks=16).generate(
        [list(range(1, 40))], 4, ignore_eos=True)[0].token_ids
    assert len(out) == 4
    assert checkpoint("tiny", tmp_path) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == written  # not rewritten
    assert not list(tmp_path.glob(".*.partial"))


def test_an_unknown_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown random model 'huge'; one of tiny, 8-layer"):
        checkpoint("huge", tmp_path)
