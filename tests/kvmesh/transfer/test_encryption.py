"""The zmq plane encrypted, attacked: KV is prompts. A data plane on an address other hosts
reach encrypts (CURVE, the source's key handed in the endpoint); a listener on the wire reads
no block, someone else answering at the source's address gets no pull through, a plaintext
receiver gets nothing, and the plaintext grpc plane is not served there at all."""
from __future__ import annotations

import asyncio
import os

import pytest
import zmq
import zmq.asyncio

from kvmesh.transfer import zmq_link
from kvmesh.transfer.endpoint import Endpoint, parse
from kvmesh.transfer.frames import CLAIM, Head
from kvmesh.transfer.transports import DataServer, TransferError, pull

MARK = b"prompt-kv-secret" * 256  # 4 KiB a block: what a listener must not read


async def _serving(**kw) -> DataServer:
    server = DataServer(**kw)
    await server.start()
    return server


def _run(body):
    async def main():
        try:
            return await body()
        finally:
            await zmq_link.close_all()

    return asyncio.run(main())


class Relay:
    """A TCP relay in front of ``target`` that records every byte it passes: a listener on
    the wire (or, pointed elsewhere, someone answering at the source's address)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.seen = bytearray()
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> Relay:
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _conn(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        tr, tw = await asyncio.open_connection(*self.target)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(1 << 16):
                self.seen += data
                dst.write(data)
                await dst.drain()
            dst.close()

        await asyncio.gather(pipe(r, tw), pipe(tr, w), return_exceptions=True)

    def close(self) -> None:
        assert self._server is not None
        self._server.close()


def via(endpoint: str, port: int) -> str:
    """``endpoint`` with its port replaced: the receiver dials the relay."""
    ep = parse(endpoint)
    return str(Endpoint(ep.transport, ep.host, port, ep.key, ep.server_key))


def test_loopback_is_plain_and_other_addresses_encrypt() -> None:
    async def body():
        plain, wide = await _serving(), await _serving(host="0.0.0.0")
        try:
            assert not plain.encrypt and plain.transports == ("zmq", "grpc", "shm")
            assert parse(plain.offer("zmq", [b"x"])).server_key == b""
            assert wide.encrypt and wide.transports == ("zmq", "shm")
            assert len(parse(wide.offer("zmq", [b"x"])).server_key) == 32
            with pytest.raises(ValueError, match="plaintext"):
                wide.offer("grpc", [b"x"])
            assert wide._grpc is None  # no plaintext listener on the wide address at all
        finally:
            await plain.close()
            await wide.close()

    _run(body)


@pytest.mark.parametrize("encrypt", [False, True])
def test_a_listener_on_the_wire_reads_blocks_only_when_plain(encrypt: bool) -> None:
    """The plaintext run shows the listener does see the bytes: the encrypted run's
    absence of them is the encryption, not a blind relay."""
    async def body():
        server = await _serving(encrypt=encrypt)
        relay = await Relay(("127.0.0.1", server._zmq.port)).start()
        try:
            blocks = [MARK[:-1] + bytes([i]) for i in range(8)]
            ep = via(server.offer("zmq", blocks), relay.port)
            got: list[bytes] = []
            assert await pull(ep, len(MARK), 8, lambda i, b: got.append(bytes(b)), 5) == 8
            return got == blocks, MARK[:64] in relay.seen, len(relay.seen)
        finally:
            relay.close()
            await server.close()

    whole, sniffed, wire = _run(body)
    assert whole and wire > 8 * len(MARK)
    assert sniffed is not encrypt


@pytest.mark.parametrize("transport", ["zmq", "shm"])
def test_encrypted_pulls_deliver_every_block(transport: str) -> None:
    async def body():
        server = await _serving(encrypt=True, frame_bytes=1 << 16)
        try:
            blocks = [os.urandom(16384) for _ in range(40)]
            got: list[bytes] = []
            await pull(server.offer(transport, blocks), 16384, 40,
                       lambda i, b: got.append(bytes(b)), 5)
            return got == blocks
        finally:
            await server.close()

    assert _run(body)


@pytest.mark.parametrize("impostor_encrypts", [True, False])
def test_someone_else_at_the_sources_address_is_refused_at_once(impostor_encrypts: bool) -> None:
    """The endpoint names source A's key; the connection reaches B (a hijacked address:
    another encrypting worker, or a plaintext one): the handshake fails, and the pull is
    refused well before its deadline."""
    async def body():
        a, b = await _serving(encrypt=True), await _serving(encrypt=impostor_encrypts)
        relay = await Relay(("127.0.0.1", b._zmq.port)).start()
        try:
            ep_a = via(a.offer("zmq", [MARK]), relay.port)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(TransferError) as e:
                await pull(ep_a, len(MARK), 1, lambda i, blk: None, 10)
            # the pull's claim (its one-time key) never left in the clear
            return e.value.reason, loop.time() - t0, parse(ep_a).key in relay.seen
        finally:
            relay.close()
            await a.close()
            await b.close()

    reason, took, leaked = _run(body)
    assert reason == "refused" and took < 5 and not leaked


def test_a_plaintext_receiver_gets_nothing_and_the_offer_survives() -> None:
    async def body():
        server = await _serving(encrypt=True)
        try:
            ep = parse(server.offer("zmq", [MARK]))
            sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
            sock.linger = 0
            sock.connect(f"tcp://{ep.address}")
            await sock.send_multipart([Head(CLAIM, ep.key, 4, 0, 1, len(MARK)).pack(), b"zmq"])
            answered = await sock.poll(1000)
            sock.close()
            got: list[bytes] = []  # the rightful receiver still pulls the offer
            await pull(str(ep), len(MARK), 1, lambda i, b: got.append(bytes(b)), 5)
            return answered, got
        finally:
            await server.close()

    answered, got = _run(body)
    assert answered == 0 and got == [MARK]


def test_endpoints_round_trip_and_a_bad_key_is_malformed() -> None:
    ep = Endpoint("zmq", "10.0.0.5", 7000, bytes(range(16)), bytes(range(32)))
    assert parse(str(ep)) == ep and str(ep).endswith("?curve=" + bytes(range(32)).hex())
    for bad in (f"{Endpoint('zmq', 'h', 1, bytes(16))}?curve=abcd",
                f"{Endpoint('zmq', 'h', 1, bytes(16))}?key={'00' * 32}"):
        with pytest.raises(TransferError) as e:
            parse(bad)
        assert e.value.reason == "malformed"
