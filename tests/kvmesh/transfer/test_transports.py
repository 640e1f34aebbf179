"""The data plane's contract, over every transport: whole blocks in order, once, or a
TransferError that says why and how many blocks landed."""
from __future__ import annotations

import asyncio
import os
import secrets

import pytest
import zmq
import zmq.asyncio

from kvmesh.transfer.endpoint import Endpoint, parse
from kvmesh.transfer.transports import (
    DEFAULT_TRANSPORT,
    TRANSPORTS,
    DataServer,
    TransferError,
    pull,
)


def _blocks(n: int, size: int) -> list[bytes]:
    return [os.urandom(size) for _ in range(n)]


async def _pull_all(ep: str, size: int, n: int, timeout_s: float = 10.0) -> list[bytes]:
    got: list[tuple[int, bytes]] = []
    assert await pull(ep, size, n, lambda i, b: got.append((i, bytes(b))), timeout_s) == n
    assert [i for i, _ in got] == list(range(n))
    return [b for _, b in got]


async def _with_server(body, **kw):
    server = DataServer(**kw)
    await server.start()
    try:
        return await body(server)
    finally:
        await server.close()


def test_the_default_is_one_of_the_transports() -> None:
    assert DEFAULT_TRANSPORT in TRANSPORTS == ("zmq", "grpc", "shm")


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(("size", "n"), [(1, 1), (4096, 300), (96 * 1024, 30), (3 << 20, 3)])
def test_round_trip_delivers_every_block_in_order(transport: str, size: int, n: int) -> None:
    async def body(server: DataServer) -> None:
        blocks = _blocks(n, size)
        ep = server.offer(transport, [memoryview(b) for b in blocks])
        assert parse(ep).transport == transport
        assert await _pull_all(ep, size, n) == blocks

    asyncio.run(_with_server(body, frame_bytes=1 << 18))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_second_pull_of_one_offer_is_refused(transport: str) -> None:
    async def body(server: DataServer) -> None:
        blocks = _blocks(3, 1024)
        ep = server.offer(transport, blocks)
        await _pull_all(ep, 1024, 3)
        with pytest.raises(TransferError) as e:
            await _pull_all(ep, 1024, 3)
        assert (e.value.reason, e.value.landed) == ("refused", 0)

    asyncio.run(_with_server(body))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_unknown_key_or_another_transports_key_is_refused(transport: str) -> None:
    async def body(server: DataServer) -> None:
        real = parse(server.offer(transport, _blocks(2, 64)))
        forged = Endpoint(transport, real.host, real.port, secrets.token_bytes(16))
        other = "shm" if transport == "zmq" else "zmq"
        crossed = parse(server.offer(other, _blocks(2, 64)))
        crossed = Endpoint(transport, real.host, real.port, crossed.key)
        for ep in (forged, crossed):
            with pytest.raises(TransferError) as e:
                await _pull_all(str(ep), 64, 2)
            assert e.value.reason == "refused"
        assert await _pull_all(str(real), 64, 2)  # the refusals did not spend the real offer

    asyncio.run(_with_server(body))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_expired_offer_is_refused_and_released(transport: str) -> None:
    async def body(server: DataServer) -> None:
        ep = server.offer(transport, _blocks(2, 64), ttl_s=0.05)
        await asyncio.sleep(0.1)
        with pytest.raises(TransferError) as e:
            await _pull_all(ep, 64, 2)
        assert (e.value.reason, e.value.landed) == ("expired", 0)
        assert len(server.book) == 0

    asyncio.run(_with_server(body))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_claim_of_another_size_is_refused(transport: str) -> None:
    async def body(server: DataServer) -> None:
        ep = server.offer(transport, _blocks(4, 256))
        with pytest.raises(TransferError) as e:
            await _pull_all(ep, 256, 5)
        assert (e.value.reason, e.value.landed) == ("mismatch", 0)

    asyncio.run(_with_server(body))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_source_closed_mid_transfer_fails_with_the_blocks_landed(transport: str) -> None:
    n, size = 96, 1 << 20

    async def main() -> None:
        server = DataServer(frame_bytes=size)
        await server.start()
        ep = server.offer(transport, [os.urandom(size)] * n)
        landed: list[int] = []
        closing: list[asyncio.Task] = []

        def sink(i: int, block: memoryview) -> None:
            assert len(block) == size
            landed.append(i)
            if i == 1:
                closing.append(asyncio.get_running_loop().create_task(server.close()))

        with pytest.raises(TransferError) as e:
            await pull(ep, size, n, sink, timeout_s=10)
        await asyncio.gather(*closing)
        assert e.value.reason == "closed"
        assert e.value.landed == len(landed) and landed == list(range(len(landed)))
        assert 2 <= e.value.landed < n

    asyncio.run(main())


@pytest.mark.parametrize("transport", ["zmq", "shm"])
def test_a_silent_source_times_out(transport: str) -> None:
    async def main() -> None:
        sock = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        try:
            ep = Endpoint(transport, "127.0.0.1", port, secrets.token_bytes(16))
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(TransferError) as e:
                await pull(str(ep), 64, 2, lambda i, b: None, timeout_s=0.3)
            assert (e.value.reason, e.value.landed) == ("timeout", 0)
            assert 0.25 < loop.time() - t0 < 2.0
        finally:
            sock.close(linger=0)

    asyncio.run(main())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_nothing_listening_is_unreachable_at_once(transport: str) -> None:
    async def main() -> None:
        async def grab(server: DataServer) -> str:
            return server.offer(transport, _blocks(1, 8))
        ep = await _with_server(grab)  # the server is closed: its ports are free again
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(TransferError) as e:
            await pull(ep, 8, 1, lambda i, b: None, timeout_s=5)
        assert e.value.reason == "unreachable"
        assert loop.time() - t0 < 3.0

    asyncio.run(main())


def test_offer_validates_its_blocks() -> None:
    async def body(server: DataServer) -> None:
        with pytest.raises(ValueError):
            server.offer("tcp", _blocks(1, 8))
        with pytest.raises(ValueError):
            server.offer("zmq", [b"a" * 8, b"b" * 9])
        with pytest.raises(ValueError):
            server.offer("zmq", [])

    asyncio.run(_with_server(body))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_offer_ends_once_and_says_how(transport: str, monkeypatch) -> None:
    from kvmesh.transfer import transports

    monkeypatch.setattr(transports, "SWEEP_S", 0.02)
    ended: dict[str, list[str]] = {"sent": [], "lapsed": [], "mismatch": [], "cut": [],
                                   "left": []}

    async def main() -> None:
        server = DataServer(frame_bytes=1 << 20)
        await server.start()
        ok = server.offer(transport, _blocks(5, 70_000), on_done=ended["sent"].append)
        server.offer(transport, _blocks(1, 8), ttl_s=0.01, on_done=ended["lapsed"].append)
        bad = server.offer(transport, _blocks(2, 8), on_done=ended["mismatch"].append)
        cut = server.offer(transport, [os.urandom(1 << 20)] * 64, on_done=ended["cut"].append)
        server.offer(transport, _blocks(1, 8), on_done=ended["left"].append)
        await _pull_all(ok, 70_000, 5)
        await asyncio.sleep(0.2)  # no offer or pull comes: the sweeper ends the lapsed one
        assert ended["lapsed"] == ["expired"]
        with pytest.raises(TransferError):
            await _pull_all(bad, 8, 3)
        closing: list[asyncio.Task] = []

        def sink(i: int, block: memoryview) -> None:
            if i == 0:
                closing.append(asyncio.get_running_loop().create_task(server.close()))

        with pytest.raises(TransferError):
            await pull(cut, 1 << 20, 64, sink, timeout_s=10)
        await asyncio.gather(*closing)

    asyncio.run(main())
    assert ended == {"sent": ["sent"], "lapsed": ["expired"], "mismatch": ["failed"],
                     "cut": ["failed"], "left": ["closed"]}


_SOURCE = """
import asyncio, sys
from kvmesh.transfer.transports import DataServer

async def main():
    server = DataServer(frame_bytes=1 << 20)
    await server.start()
    print(server.offer(sys.argv[1], [bytes([i % 256]) * (1 << 20) for i in range(256)]),
          flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


@pytest.mark.integration
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_source_process_killed_mid_transfer_fails_closed_with_whole_blocks(
        transport: str) -> None:
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", _SOURCE, transport], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        ep = proc.stdout.readline().strip()
        landed: list[int] = []

        def sink(i: int, block: memoryview) -> None:
            assert block == bytes([i % 256]) * (1 << 20)  # whole, and the right one
            landed.append(i)
            if i == 2:
                proc.send_signal(signal.SIGKILL)

        with pytest.raises(TransferError) as e:
            asyncio.run(pull(ep, 1 << 20, 256, sink, timeout_s=20))
        assert e.value.reason == "closed"
        assert e.value.landed == len(landed) and 3 <= len(landed) < 256
    finally:
        proc.kill()
        proc.wait(10)
