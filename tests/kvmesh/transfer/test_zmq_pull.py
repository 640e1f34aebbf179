"""The zmq/shm receiver against a crafted source: every frame that breaks the contract ends
the pull before any of its bytes reach the sink."""
from __future__ import annotations

import asyncio
import secrets

import pytest
import zmq
import zmq.asyncio

from kvmesh.transfer.endpoint import Endpoint
from kvmesh.transfer.frames import CLAIM, DATA, Head, TransferError
from kvmesh.transfer.transports import pull

BB = 1024


def _crafted(frames, timeout_s: float = 5) -> tuple[TransferError, list[int]]:
    """Pull 4 blocks from a source that answers the claim with ``frames(key)`` (lists of
    parts after the ROUTER identity); returns the error and the blocks the sink saw."""

    async def main():
        sock = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        sock.linger = 0
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        key = secrets.token_bytes(16)

        async def source() -> None:
            ident, head, transport = await sock.recv_multipart()
            assert head[2] == CLAIM and transport == b"zmq"
            for parts in frames(key):
                await sock.send_multipart([ident, *parts])
            await asyncio.sleep(10)

        task = asyncio.create_task(source())
        seen: list[int] = []
        try:
            with pytest.raises(TransferError) as e:
                await pull(str(Endpoint("zmq", "127.0.0.1", port, key)), BB, 4,
                           lambda i, b: seen.append(i), timeout_s=timeout_s)
        finally:
            task.cancel()
            sock.close(linger=0)
        return e.value, seen

    return asyncio.run(main())


def _data(key: bytes, index: int, first: int, count: int, nbytes: int) -> list[bytes]:
    return [Head(DATA, key, index, first, count).pack(), bytes(nbytes)]


def test_a_truncated_frame_is_refused_whole() -> None:
    err, seen = _crafted(lambda k: [_data(k, 0, 0, 2, 2 * BB - 1)])
    assert (err.reason, err.landed, seen) == ("truncated", 0, [])


def test_an_oversized_frame_is_refused() -> None:
    err, seen = _crafted(lambda k: [_data(k, 0, 0, 1, BB), _data(k, 1, 1, 2, 2 * BB + 1)])
    assert (err.reason, err.landed, seen) == ("oversized", 1, [0])


def test_a_frame_past_the_last_block_is_refused() -> None:
    err, seen = _crafted(lambda k: [_data(k, 0, 0, 5, 5 * BB)])
    assert (err.reason, err.landed, seen) == ("oversized", 0, [])


def test_an_out_of_order_frame_is_refused_after_the_blocks_before_it() -> None:
    err, seen = _crafted(lambda k: [_data(k, 0, 0, 1, BB), _data(k, 2, 2, 1, BB)])
    assert (err.reason, err.landed, seen) == ("out_of_order", 1, [0])


def test_a_repeated_block_is_out_of_order() -> None:
    err, seen = _crafted(lambda k: [_data(k, 0, 0, 2, 2 * BB), _data(k, 1, 1, 1, BB)])
    assert (err.reason, err.landed, seen) == ("out_of_order", 2, [0, 1])


def test_a_frame_for_another_offer_never_reaches_this_pull() -> None:
    err, seen = _crafted(lambda k: [_data(secrets.token_bytes(16), 0, 0, 1, BB)], timeout_s=0.5)
    assert (err.reason, err.landed, seen) == ("timeout", 0, [])


def test_parts_that_do_not_split_into_blocks_are_refused() -> None:
    def frames(k: bytes) -> list[list[bytes]]:
        return [[Head(DATA, k, 0, 0, 2).pack(), bytes(BB - 1), bytes(BB + 1)]]

    err, seen = _crafted(frames)
    assert (err.reason, err.landed, seen) == ("malformed", 0, [])


def test_garbage_instead_of_a_head_is_malformed() -> None:
    err, seen = _crafted(lambda k: [[b"hello"]])
    assert (err.reason, err.landed, seen) == ("malformed", 0, [])


def test_an_error_frame_carries_the_sources_reason() -> None:
    from kvmesh.transfer.frames import ERROR

    err, seen = _crafted(lambda k: [_data(k, 0, 0, 1, BB), [Head(ERROR, k).pack(), b"expired"]])
    assert (err.reason, err.landed, seen) == ("expired", 1, [0])
