"""The zmq source against hand-driven receivers: it never has more than its window in
flight, whatever credit it is sent; a second claim of a running pull is refused; garbage
is ignored."""
from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from kvmesh.transfer.endpoint import parse
from kvmesh.transfer.frames import CLAIM, CREDIT, DATA, ERROR, Head, unpack
from kvmesh.transfer.transports import DataServer
from kvmesh.transfer.zmq_serve import WINDOW_BYTES

BB = 1 << 20


async def _dealer(address: str) -> zmq.asyncio.Socket:
    sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(f"tcp://{address}")
    return sock


async def _drain(sock: zmq.asyncio.Socket, wait_s: float = 0.3) -> list[list[bytes]]:
    got = []
    while await sock.poll(int(wait_s * 1000)):
        got.append(await sock.recv_multipart())
    return got


def test_the_window_bounds_frames_in_flight_whatever_credit_says() -> None:
    async def main() -> None:
        server = DataServer(frame_bytes=BB)
        await server.start()
        sock = None
        try:
            n = 64
            ep = parse(server.offer("zmq", [bytes(BB)] * n))
            window = WINDOW_BYTES // BB
            sock = await _dealer(ep.address)
            await sock.send_multipart([Head(CLAIM, ep.key, 64, 0, n, BB).pack(), b"zmq"])
            first = await _drain(sock)
            assert len(first) == window and all(unpack(m[0]).kind == DATA for m in first)
            # a receiver granting a huge credit gets at most one window more, not the rest
            await sock.send(Head(CREDIT, ep.key, extra=1 << 40).pack())
            assert len(await _drain(sock)) == window < n - window
        finally:
            if sock is not None:
                sock.close(0)
            await server.close()

    asyncio.run(main())


def test_a_second_claim_while_the_first_runs_is_refused_and_garbage_ignored() -> None:
    async def main() -> None:
        server = DataServer(frame_bytes=BB)
        await server.start()
        socks = []
        try:
            ep = parse(server.offer("zmq", [bytes(BB)] * 64))
            a, b = await _dealer(ep.address), await _dealer(ep.address)
            socks += [a, b]
            await b.send_multipart([b"garbage"])
            await b.send_multipart([b"KV" + bytes(60)])
            await a.send_multipart([Head(CLAIM, ep.key, 2, 0, 64, BB).pack(), b"zmq"])
            assert len(await _drain(a)) == 2
            await b.send_multipart([Head(CLAIM, ep.key, 2, 0, 64, BB).pack(), b"zmq"])
            (refusal,) = await _drain(b)
            assert unpack(refusal[0]).kind == ERROR and refusal[1] == b"refused"
        finally:
            for s in socks:
                s.close(0)
            await server.close()

    asyncio.run(main())
