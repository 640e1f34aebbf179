"""``bridge.wake.Wake`` (edge-triggered ZMQ FDs on the asyncio loop), alone and under a
``Subscriber``: no stall on messages already queued, prompt wakes, timers, readers removed."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest
import zmq

from bridge.wake import Wake
from tests.bridge.fake_vllm import FakeEngine
from tests.bridge.test_subscriber import Bridge, chain_of, ports, root, urls

PROMPT = 1.0  # far under every deadline the waits are given (10 s)


@contextlib.contextmanager
def pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://wake")
    b.connect("inproc://wake")
    try:
        yield a, b
    finally:
        a.close(linger=0)
        b.close(linger=0)
        ctx.term()


async def timed(wake: Wake, until_in: float) -> tuple[list[bool], float]:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    got = await wake.poll(t0 + until_in)
    return got, loop.time() - t0


def test_messages_left_queued_wake_at_once_though_the_fd_signalled_only_once() -> None:
    async def main():
        with pair() as (a, b):
            wake = Wake(asyncio.get_running_loop(), b)
            for i in range(3):
                a.send(b"%d" % i)
            assert (await timed(wake, 10))[0] == [True]  # reading EVENTS took the signal
            b.recv()
            got, took = await timed(wake, 10)  # two left: no new signal comes for them
            assert got == [True] and took < PROMPT
            wake.close()
    asyncio.run(main())


def test_a_message_sent_between_waits_wakes_the_next_one_promptly() -> None:
    async def main():
        with pair() as (a, b):
            wake = Wake(asyncio.get_running_loop(), b)
            a.send(b"x")
            await timed(wake, 10)
            b.recv()
            a.send(b"y")  # while nobody waits
            await asyncio.sleep(0.01)
            got, took = await timed(wake, 10)
            assert got == [True] and took < PROMPT
            b.recv()

            async def later():
                await asyncio.sleep(0.05)
                a.send(b"z")  # while waiting, after the socket was emptied
            t = asyncio.create_task(later())
            got, took = await timed(wake, 10)
            assert got == [True] and took < PROMPT
            await t
            wake.close()
    asyncio.run(main())


def test_a_socket_emptied_to_again_is_not_read_before_waiting_yet_wakes() -> None:
    async def main():
        with pair() as (a, b):
            wake = Wake(asyncio.get_running_loop(), b)
            a.send(b"x")
            await timed(wake, 10)
            b.recv()
            with pytest.raises(zmq.Again):
                b.recv(zmq.NOBLOCK)
            wake.emptied(0)
            a.send(b"y")  # while nobody waits: the FD signals, the reader takes it
            await asyncio.sleep(0.01)
            got, took = await timed(wake, 10)
            assert got == [True] and took < PROMPT
            assert b.recv() == b"y"
            with pytest.raises(zmq.Again):
                b.recv(zmq.NOBLOCK)
            wake.emptied(0)
            got, took = await timed(wake, 0.05)
            assert got == [False] and took >= 0.04
            wake.close()
    asyncio.run(main())


def test_a_deadline_sooner_than_the_armed_one_is_kept() -> None:
    async def main():
        with pair() as (a, b):
            wake = Wake(asyncio.get_running_loop(), b)
            a.send(b"x")
            await timed(wake, 10)  # nothing to wait for: no timer armed
            b.recv()

            async def later():
                await asyncio.sleep(0.02)
                a.send(b"y")
            t = asyncio.create_task(later())
            assert (await timed(wake, 10))[0] == [True]  # arms the 10 s timer, woken sooner
            await t
            b.recv()
            got, took = await timed(wake, 0.05)
            assert got == [False] and 0.04 < took < PROMPT
            wake.close()
    asyncio.run(main())


def test_close_removes_the_readers() -> None:
    async def main():
        loop = asyncio.get_running_loop()
        with pair() as (_, b):
            Wake(loop, b).close()
            assert not loop.remove_reader(b.FD)
    asyncio.run(main())


def test_a_burst_longer_than_a_drain_is_applied_without_another_batch() -> None:
    """The drain stops with batches queued; nothing signals them again (edge-triggered FD)
    and nothing else wakes the subscriber here (no replay, no probe)."""
    async def main():
        pub, _ = ports()
        engine = FakeEngine(pub, None)
        async with Bridge(*urls(pub, None), probe_interval=None) as b:
            b.sub.DRAIN = 3
            await b.live(engine)
            for i in range(40):
                engine.publish(root(i, 100 + i))
            await b.until(lambda: b.state.expected == engine.seq, "the whole burst")
            assert chain_of(39) in b.holds() and b.stats.unfilled == 0
        await engine.close()
    asyncio.run(main())


def test_a_cancelled_subscriber_leaves_no_reader_behind() -> None:
    async def main():
        loop = asyncio.get_running_loop()
        added: set[int] = set()
        removed: set[int] = set()
        add, remove = loop.add_reader, loop.remove_reader

        def add_reader(fd, *a):
            added.add(fd)
            return add(fd, *a)

        def remove_reader(fd):
            removed.add(fd)
            return remove(fd)
        loop.add_reader, loop.remove_reader = add_reader, remove_reader  # type: ignore[method-assign]
        pub, rep = ports()
        engine = FakeEngine(pub, rep)
        async with Bridge(*urls(pub, rep), probe_interval=0.05) as b:
            await b.live(engine)
            engine.publish(root(1, 11))
            await b.until(lambda: chain_of(1) in b.holds())
        await engine.close()
        assert added and added <= removed
    asyncio.run(main())
