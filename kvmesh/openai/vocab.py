"""The built-in ``tiny`` model's byte vocabulary, declared once for every layer.

Ids 0..255 are the UTF-8 bytes of the text; then three special tokens: BOS 256, EOS 257,
PAD 258 (so ``VOCAB`` is 259). The worker's loader builds the tiny model on these ids, its
tokenizer encodes with them, and the gateway and the worker's HTTP API tokenize text with
them, all without torch. ``decode`` drops every id that is not a byte and replaces invalid
UTF-8 (a multi-byte character cut by a stream) with U+FFFD, so decoding never raises.
"""
from __future__ import annotations

from collections.abc import Iterable

TINY = "tiny"  # the model name that selects this vocabulary
BYTES = 256
BOS, EOS, PAD = 256, 257, 258
VOCAB = 259
CONTEXT = 8192  # the tiny model's max_position_embeddings


def encode(text: str, add_bos: bool = False) -> list[int]:
    """The ids of ``text``'s UTF-8 bytes, BOS first when ``add_bos``."""
    ids = list(text.encode("utf-8"))
    return [BOS, *ids] if add_bos else ids


def decode(ids: Iterable[int]) -> str:
    """The text of ``ids`` without special tokens (a cut character decodes to U+FFFD)."""
    return bytes(i for i in ids if 0 <= i < BYTES).decode("utf-8", errors="replace")
