"""The gateway's tokenizers: the workers' byte-level vocabulary, a model directory's
``tokenizer.json``."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from client.gateway.cli import build_config
from client.gateway.textstream import TextStream
from client.gateway.tokenizer import ByteLevelTokenizer, JsonTokenizer, load_tokenizer

BYTES = ByteLevelTokenizer()


def test_byte_level_matches_the_workers_vocabulary() -> None:
    assert BYTES.encode("hé") == [104, 195, 169]
    assert BYTES.decode([256, 104, 195, 169, 257]) == "hé"  # BOS/EOS dropped
    assert BYTES.vocab_size == 259


def _write_model_dir(path: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    path.mkdir()
    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "!": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ x }}"}))
    return path


def test_model_dir_uses_its_tokenizer_json(tmp_path: Path) -> None:
    model_dir = _write_model_dir(tmp_path / "my-model")
    tok = load_tokenizer(model_dir)
    assert isinstance(tok, JsonTokenizer)
    assert tok.encode("hello world !") == [1, 2, 3]
    assert tok.vocab_size == 4
    stream = TextStream(tok)
    assert stream.push([1]) + stream.push([2, 3]) + stream.finish() == tok.decode([1, 2, 3])
    with pytest.raises(ValueError, match="--max-model-len"):  # no config.json: no context
        build_config("127.0.0.1:1", model_dir=model_dir)
    config = build_config("127.0.0.1:1", model_dir=model_dir, max_model_len=64)
    assert config.model_name == "my-model" and config.max_model_len == 64
    (model_dir / "config.json").write_text('{"max_position_embeddings": 512}')
    config = build_config("127.0.0.1:1", model=str(model_dir), served_model_name="m")
    assert config.model_name == "m" and config.max_model_len == 512
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path)
