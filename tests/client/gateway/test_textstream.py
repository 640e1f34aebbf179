"""Incremental detokenizing (``TextStream``): characters never cut, stop strings."""
from __future__ import annotations

import pytest

from client.gateway.textstream import TextStream
from client.gateway.tokenizer import ByteLevelTokenizer

BYTES = ByteLevelTokenizer()


def stream_text(ids: list[int], sizes: int, stop: tuple[str, ...] = ()) -> tuple[str, bool]:
    stream = TextStream(BYTES, stop)
    out = "".join(stream.push(ids[i:i + sizes]) for i in range(0, len(ids), sizes))
    return out + stream.finish(), stream.stopped


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
