"""Tokenizers, incremental detokenizing with stop strings, the chat template, CLI config."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from client.gateway.chat import ChatFormatError, message_text, render_chat
from client.gateway.cli import build_config
from client.gateway.textstream import TextStream
from client.gateway.tokenizer import ByteLevelTokenizer, JsonTokenizer, load_tokenizer

BYTES = ByteLevelTokenizer()


def stream_text(ids: list[int], sizes: int, stop: tuple[str, ...] = ()) -> tuple[str, bool]:
    stream = TextStream(BYTES, stop)
    out = "".join(stream.push(ids[i:i + sizes]) for i in range(0, len(ids), sizes))
    return out + stream.finish(), stream.stopped


def test_byte_level_matches_the_workers_vocabulary() -> None:
    assert BYTES.encode("hé") == [104, 195, 169]
    assert BYTES.decode([256, 104, 195, 169, 257]) == "hé"  # BOS/EOS dropped
    assert BYTES.vocab_size == 259


@pytest.mark.parametrize("size", [1, 2, 3, 100])
def test_multibyte_characters_are_never_cut(size: int) -> None:
    text = "naïve € 😀 ok"
    ids = list(text.encode())
    stream = TextStream(BYTES)
    pieces = [stream.push(ids[i:i + size]) for i in range(0, len(ids), size)]
    pieces.append(stream.finish())
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_a_cut_character_at_the_end_is_flushed_as_replacement() -> None:
    ids = list("ok€".encode())[:-1]
    assert stream_text(ids, 1) == ("ok\ufffd", False)


@pytest.mark.parametrize("size", [1, 2, 5])
def test_stop_strings_truncate_and_hold_back_partial_matches(size: int) -> None:
    ids = list(b"hello world. more")
    assert stream_text(ids, size, ("world",)) == ("hello ", True)
    assert stream_text(ids, size, ("xyz", ". m")) == ("hello world", True)
    assert stream_text(ids, size, ("worlds",)) == ("hello world. more", False)


def test_partial_stop_match_is_withheld_until_resolved() -> None:
    stream = TextStream(BYTES, ["STOP"])
    assert stream.push(b"abST") == "ab"
    assert stream.push(b"x") == "STx"
    assert stream.push(b"ST") == ""
    assert stream.push(b"OP!") == ""
    assert stream.stopped and stream.push(b"more") == "" and stream.finish() == ""


def test_chat_template() -> None:
    prompt = render_chat([("system", "S"), ("user", "U"), ("assistant", "A"), ("user", "V")])
    assert prompt == "<|system|>\nS\n<|user|>\nU\n<|assistant|>\nA\n<|user|>\nV\n<|assistant|>\n"
    assert message_text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                        "m") == "a\nb"
    assert message_text(None, "m") == ""
    with pytest.raises(ChatFormatError):
        render_chat([])


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


def test_cli_registers_gateway_and_rejects_bad_flags(tmp_path: Path) -> None:
    import typer

    from client.gateway import register

    app = typer.Typer()
    register(app)
    app.command("other")(lambda: None)  # two verbs, so typer keeps the verb names
    runner = CliRunner()
    result = runner.invoke(app, ["gateway", "--help"])
    assert result.exit_code == 0 and "--tenant-keys" in result.output
    missing = tmp_path / "nope.txt"
    result = runner.invoke(app, ["gateway", "--tenant-keys", str(missing)])
    assert result.exit_code == 2
    (tmp_path / "keys.txt").write_text("only-a-key\n")
    result = runner.invoke(app, ["gateway", "--tenant-keys", str(tmp_path / "keys.txt")])
    assert result.exit_code == 2
    assert "line 1" in result.output


def test_gateway_modules_do_not_import_torch() -> None:
    code = ("import sys, client.gateway.app, client.gateway.cli; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_tiny_context_matches_the_workers_model() -> None:
    """The gateway checks prompt lengths against the tiny model's context without importing
    the worker (torch); the two numbers must agree."""
    from client.gateway.cli import model_context
    from worker.model.loader import TINY_CONFIG

    assert model_context("tiny") == TINY_CONFIG["max_position_embeddings"]
