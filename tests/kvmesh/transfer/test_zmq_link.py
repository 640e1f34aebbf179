"""Receiver links: one connection per source, reused and shared by concurrent pulls, closed
when idle; a pull that gives up tells the source, which releases the offer at once."""
from __future__ import annotations

import asyncio
import os
import time

import pytest

from kvmesh.transfer import zmq_link
from kvmesh.transfer.endpoint import parse
from kvmesh.transfer.transports import DataServer, TransferError, pull


def _run(body, **kw):
    async def main():
        server = DataServer(**kw)
        await server.start()
        try:
            return await body(server)
        finally:
            await zmq_link.close_all()
            await server.close()

    return asyncio.run(main())


@pytest.mark.parametrize("transport", ["zmq", "shm"])
def test_pulls_from_one_source_share_one_link(transport: str) -> None:
    async def body(server: DataServer) -> None:
        blocks = [[os.urandom(4096) for _ in range(50)] for _ in range(4)]
        eps = [server.offer(transport, b) for b in blocks]
        first: list[bytes] = []
        await pull(eps[0], 4096, 50, lambda i, b: first.append(bytes(b)), 5)
        links = zmq_link._links[asyncio.get_running_loop()]
        (only,) = links.values()
        got: list[list[bytes]] = [[], [], []]
        await asyncio.gather(*(
            pull(ep, 4096, 50, lambda i, b, out=out: out.append(bytes(b)), 5)
            for ep, out in zip(eps[1:], got, strict=True)))
        assert [first, *got] == blocks
        assert list(links.values()) == [only] and not only.queues

    _run(body, frame_bytes=16384)


def test_an_idle_link_closes_itself(monkeypatch) -> None:
    monkeypatch.setattr(zmq_link, "IDLE_S", 0.05)

    async def body(server: DataServer) -> None:
        ep = server.offer("zmq", [b"x" * 64])
        await pull(ep, 64, 1, lambda i, b: None, 5)
        (lk,) = zmq_link._links[asyncio.get_running_loop()].values()
        assert lk.address == parse(ep).address
        await asyncio.sleep(0.2)
        assert lk.failed == "idle" and lk._task.done()
        assert not zmq_link._links[asyncio.get_running_loop()]
        ep2 = server.offer("zmq", [b"y" * 64])  # the next pull connects afresh
        assert await pull(ep2, 64, 1, lambda i, b: None, 5) == 1

    _run(body)


@pytest.mark.parametrize("transport", ["zmq", "shm"])
def test_a_pull_that_gives_up_releases_the_offer_at_the_source(transport: str) -> None:
    async def body(server: DataServer) -> None:
        ep = server.offer(transport, [os.urandom(16384)] * 200)

        def slow_sink(i: int, b: memoryview) -> None:
            time.sleep(0.01)  # a receiver that cannot keep up with its deadline

        with pytest.raises(TransferError) as e:
            await pull(ep, 16384, 200, slow_sink, timeout_s=0.2)
        assert e.value.reason == "timeout" and 0 < e.value.landed < 200
        for _ in range(100):  # idle_s is 30 s: only the CANCEL frees it this soon
            if not server._zmq._pulls:
                break
            await asyncio.sleep(0.01)
        assert not server._zmq._pulls

    _run(body, frame_bytes=16384)
