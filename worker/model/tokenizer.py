"""Text <-> token ids: a byte-level tokenizer for ``tiny``, ``tokenizers`` for HF directories.

Both implement the `Tokenizer` protocol. The engine works on token ids only; tokenizers are
for the CLI, demos and the server's text convenience paths.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from kvmesh.openai import vocab
from worker.model.loader import TINY, TINY_BOS, TINY_EOS, TINY_PAD


class Tokenizer(Protocol):
    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int | None

    def encode(self, text: str, add_bos: bool = False) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """The tiny model's vocabulary (``kvmesh.openai.vocab``): UTF-8 bytes are ids 0..255,
    BOS/EOS/PAD follow; ``decode`` drops special ids and replaces invalid UTF-8."""

    def __init__(self) -> None:
        self.vocab_size: int = vocab.VOCAB
        self.bos_token_id: int | None = TINY_BOS
        self.eos_token_id: int | None = TINY_EOS
        self.pad_token_id: int | None = TINY_PAD

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        return vocab.encode(text, add_bos)

    def decode(self, ids: list[int]) -> str:
        return vocab.decode(ids)


class HFTokenizer:
    """Wrapper of a ``tokenizer.json`` loaded with the ``tokenizers`` library.

    ``encode`` skips the post-processor's special tokens; ``add_bos`` prepends BOS (from the
    model's ``config.json``) when it is known and not already first.
    """

    def __init__(self, path: Path, bos_token_id: int | None = None,
                 eos_token_id: int | None = None) -> None:
        from tokenizers import Tokenizer as _Tok

        self._tok = _Tok.from_file(str(path))
        self.vocab_size: int = self._tok.get_vocab_size(with_added_tokens=True)
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = list(self._tok.encode(text, add_special_tokens=False).ids)
        if add_bos and self.bos_token_id is not None and ids[:1] != [self.bos_token_id]:
            ids.insert(0, self.bos_token_id)
        return ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)


def load_tokenizer(path_or_name: str | Path) -> Tokenizer:
    """``"tiny"`` -> `ByteTokenizer`; a directory with ``tokenizer.json`` -> `HFTokenizer`
    (BOS/EOS from its ``config.json`` when present). Raises ``FileNotFoundError`` otherwise."""
    if str(path_or_name) == TINY:
        return ByteTokenizer()
    path = Path(path_or_name)
    file = path / "tokenizer.json"
    if not file.is_file():
        raise FileNotFoundError(f"no tokenizer.json in {path}")
    bos = eos = None
    if (path / "config.json").is_file():
        from worker.model.config import ModelConfig

        try:
            cfg = ModelConfig.from_file(path)
            bos, eos = cfg.bos_token_id, (cfg.eos_token_ids or (None,))[0]
        except ValueError:
            pass
    return HFTokenizer(file, bos, eos)
