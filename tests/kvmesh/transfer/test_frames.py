"""Frame heads and the receiver's frame check."""
from __future__ import annotations

import pytest

from kvmesh.transfer.frames import (
    DATA,
    HEAD,
    SEGMENT,
    FrameCheck,
    Head,
    TransferError,
    blocks_per_frame,
    frame_spans,
    unpack,
)

KEY = bytes(range(16))


def test_a_head_round_trips() -> None:
    h = Head(DATA, KEY, 3, 40, 8, 1 << 40)
    assert unpack(h.pack() + b"payload") == h
    assert len(h.pack()) == HEAD.size


@pytest.mark.parametrize("buf", [b"", b"KV", b"XX" + bytes(HEAD.size)])
def test_what_is_not_a_head_is_malformed(buf: bytes) -> None:
    with pytest.raises(TransferError) as e:
        unpack(buf, landed=5)
    assert (e.value.reason, e.value.landed) == ("malformed", 5)


def test_frames_hold_whole_blocks_and_cover_the_pull() -> None:
    assert blocks_per_frame(300 << 10, 1 << 20) == 3
    assert blocks_per_frame(4 << 20, 1 << 20) == 1  # a block larger than a frame: one each
    assert frame_spans(7, 3) == [(0, 3), (3, 3), (6, 1)]


def test_the_check_accepts_the_next_frame_only() -> None:
    c = FrameCheck(KEY, 100, 5)
    c.check(Head(DATA, KEY, 0, 0, 2), 200)
    c.advance(Head(DATA, KEY, 0, 0, 2))
    c.check(Head(SEGMENT, KEY, 1, 2, 3), None)
    for head, size, reason in [
        (Head(DATA, KEY, 2, 2, 3), 300, "out_of_order"),   # skipped a frame index
        (Head(DATA, KEY, 1, 3, 2), 200, "out_of_order"),   # skipped a block
        (Head(DATA, KEY, 1, 2, 4), 400, "oversized"),      # past the last block
        (Head(DATA, KEY, 1, 2, 0), 0, "oversized"),        # an empty frame
        (Head(DATA, KEY, 1, 2, 3), 299, "truncated"),
        (Head(DATA, KEY, 1, 2, 3), 301, "oversized"),
        (Head(DATA, bytes(16), 1, 2, 3), 300, "malformed"),
    ]:
        with pytest.raises(TransferError) as e:
            c.check(head, size)
        assert (e.value.reason, e.value.landed) == (reason, 2), head
    c.advance(Head(DATA, KEY, 1, 2, 3))
    assert c.done and c.landed == 5
