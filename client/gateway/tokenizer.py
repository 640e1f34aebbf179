"""Text <-> token ids for the gateway, without torch.

Two vocabularies, matching the workers': ``tiny`` is byte-level (``kvmesh.openai.vocab``, the
ids the workers' tiny model uses), and a model directory is tokenized with its
``tokenizer.json`` through the ``tokenizers`` library.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

from kvmesh.openai import vocab

TINY = vocab.TINY
TINY_CONTEXT = vocab.CONTEXT


class Tokenizer(Protocol):
    """What the gateway needs from a tokenizer."""

    vocab_size: int

    def encode(self, text: str) -> list[int]:
        """The prompt ids for ``text`` (special tokens as the model expects them)."""
        ...

    def decode(self, ids: list[int]) -> str:
        """Text for ``ids``, special tokens dropped; a cut character decodes to U+FFFD."""
        ...


class ByteLevelTokenizer:
    """The tiny model's vocabulary: UTF-8 bytes, no BOS added (as ``kvmesh generate --text``)."""

    vocab_size = vocab.VOCAB

    def encode(self, text: str) -> list[int]:
        return vocab.encode(text)

    def decode(self, ids: list[int]) -> str:
        return vocab.decode(ids)


class JsonTokenizer:
    """A Hugging Face ``tokenizer.json`` loaded with ``tokenizers``.

    ``encode`` lets the tokenizer's own post-processor add its special tokens (BOS for Llama
    style models), as a Hugging Face ``tokenizer(text)`` call does.
    """

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as _Tokenizer

        self._tok = _Tokenizer.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=True).ids)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)


def load_tokenizer(model_dir: str | Path | None) -> Tokenizer:
    """``None`` or ``"tiny"`` -> byte-level; a directory -> its ``tokenizer.json``.

    Raises ``FileNotFoundError`` when the directory has no ``tokenizer.json``.
    """
    if model_dir is None or str(model_dir) == TINY:
        return ByteLevelTokenizer()
    file = Path(model_dir) / "tokenizer.json"
    if not file.is_file():
        raise FileNotFoundError(f"no tokenizer.json in {model_dir}")
    return JsonTokenizer(file)

