"""The peer-KV data plane: a source offers blocks, a receiver pulls them once.

The worker side sees only this module: :class:`DataServer` (one per source process,
listening on every transport) and :func:`pull`. Transports:

- ``zmq``: multipart frames of about ``frame_bytes`` over TCP, blocks sent zero-copy,
  credit-based flow control (:mod:`kvmesh.transfer.zmq_serve`). The default (see
  docs/architecture.md#peer-kv-transfer-the-data-plane for the figures that chose it).
- ``grpc``: a server-streaming method on the DataServer's grpc.aio server
  (:mod:`kvmesh.transfer.grpc_plane`).
- ``shm``: same host only; frames written into an owner-only /dev/shm segment, the control
  messages over the zmq socket (:mod:`kvmesh.transfer.shm_segment`).

On an address other hosts reach, the zmq socket (so the zmq and shm planes) is CURVE-encrypted
and the grpc plane, plaintext, is not served (:attr:`DataServer.transports`): the bytes are
prompts' KV. On loopback all three are plain (only this host can read them).

An RDMA backend (NIXL/UCX) would be one more name here behind the same offer/pull pair.

See docs/architecture.md#peer-kv-transfer-the-data-plane.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import grpc

from kvmesh.ops.loopback import is_local
from kvmesh.transfer import grpc_plane, zmq_pull
from kvmesh.transfer.endpoint import Endpoint, parse
from kvmesh.transfer.frames import DEFAULT_FRAME_BYTES, MAX_BLOCK_BYTES, TransferError
from kvmesh.transfer.offers import OfferBook
from kvmesh.transfer.zmq_serve import ZmqServe

__all__ = ["DEFAULT_TRANSPORT", "TRANSPORTS", "DataServer", "TransferError", "pull"]

TRANSPORTS = ("zmq", "grpc", "shm")
DEFAULT_TRANSPORT = "zmq"
SWEEP_S = 0.5  # how late a lapsed offer may release its blocks


class DataServer:
    """One per source process; listens on every transport it serves, on ``host`` (the
    address it binds and advertises in its endpoints: give the one peers reach it at).
    ``frame_bytes``: the size frames are cut to (whole blocks, at least one per frame);
    ``idle_s``: a zmq/shm receiver that sends no credit for that long is dropped.
    The zmq socket runs CURVE whenever ``host`` is not loopback (the rule of the event
    sockets, :func:`kvmesh.ops.loopback.is_local`); ``encrypt`` turns it on for loopback too
    (a benchmark's choice), never off."""

    def __init__(self, host: str = "127.0.0.1", *, frame_bytes: int = DEFAULT_FRAME_BYTES,
                 idle_s: float = 30.0, encrypt: bool = False) -> None:
        if frame_bytes < 1:
            raise ValueError(f"frame_bytes must be >= 1, got {frame_bytes}")
        self.host = host
        self.encrypt = encrypt or not is_local(f"tcp://{host}:0")
        # the grpc plane has no encryption of its own here: never served where it would leak
        self.transports = ("zmq", "shm") if self.encrypt else TRANSPORTS
        self.book = OfferBook()
        self._zmq = ZmqServe(self.book, host, frame_bytes, idle_s, self.encrypt)
        self._frame_bytes = frame_bytes
        self._grpc: grpc.aio.Server | None = None
        self._grpc_port = 0
        self._sweeper: asyncio.Task | None = None

    async def start(self) -> None:
        await self._zmq.start()
        if "grpc" in self.transports:
            server = grpc.aio.server(options=grpc_plane.OPTIONS)
            server.add_generic_rpc_handlers((grpc_plane.handler(self.book, self._frame_bytes),))
            host = f"[{self.host}]" if ":" in self.host else self.host
            self._grpc_port = server.add_insecure_port(f"{host}:0")
            await server.start()
            self._grpc = server
        self._sweeper = asyncio.create_task(self._sweep())

    async def _sweep(self) -> None:
        while True:  # lapsed offers end on time even when no new offer or pull comes
            await asyncio.sleep(SWEEP_S)
            self.book.sweep()

    async def close(self) -> None:
        """Stop serving: pulls in flight end ("closed" on their side), offers are dropped."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        await self._zmq.close()
        if self._grpc is not None:
            await self._grpc.stop(grace=None)
            self._grpc = None
        self.book.clear()

    def offer(self, transport: str, blocks: Sequence[memoryview | bytes],
              ttl_s: float = 30.0, *, on_done: Callable[[str], None] | None = None) -> str:
        """Make ``blocks`` (each one block's KV bytes, all the same size) pullable ONCE over
        ``transport``; returns an endpoint string for the receiver (it carries a one-time
        random key). An offer not pulled within ttl_s is dropped; a second pull is refused.

        The blocks are referenced, not copied: keep them unchanged until the offer ends.
        ``on_done(outcome)`` is called once when it does, after the data plane stopped
        reading them: "sent" (every frame left), "failed" (the pull stopped half way or
        did not match), "expired" (not pulled within ttl_s), "closed" (the server closed):
        release the blocks' read lease there."""
        if transport not in TRANSPORTS:
            raise ValueError(f"unknown transport {transport!r}; one of {TRANSPORTS}")
        if transport not in self.transports:
            raise ValueError(f"{transport} is plaintext and this data plane is on {self.host}, "
                             f"which other hosts reach: use one of {self.transports} (encrypted)")
        if self._sweeper is None:
            raise RuntimeError("DataServer.offer before start()")
        if blocks and memoryview(blocks[0]).nbytes > MAX_BLOCK_BYTES:
            raise ValueError(f"blocks of {memoryview(blocks[0]).nbytes} bytes exceed "
                             f"{MAX_BLOCK_BYTES}")
        offer = self.book.add(transport, blocks, ttl_s, on_done)
        if transport == "grpc":
            return str(Endpoint(transport, self.host, self._grpc_port, offer.key))
        return str(Endpoint(transport, self.host, self._zmq.port, offer.key, self._zmq.public_key))


async def pull(endpoint: str, block_bytes: int, count: int,
               sink: Callable[[int, memoryview], None], timeout_s: float) -> int:
    """Receive ``count`` blocks of ``block_bytes`` from ``endpoint``; call ``sink(i, block)``
    for each WHOLE block in order (never a partial one); return ``count``; on any failure
    (timeout, source gone mid-transfer, truncated/oversized/out-of-order frame, unknown or
    already-pulled key) raise TransferError(reason, landed).

    ``block`` is valid only during the call (it may view a receive buffer): copy it out."""
    if block_bytes < 1 or block_bytes > MAX_BLOCK_BYTES or count < 1:
        raise ValueError(f"block_bytes must be 1..{MAX_BLOCK_BYTES} and count >= 1")
    ep = parse(endpoint)
    if ep.transport == "grpc":
        return await grpc_plane.pull(ep, block_bytes, count, sink, timeout_s)
    if ep.transport in ("zmq", "shm"):
        return await zmq_pull.pull(ep, block_bytes, count, sink, timeout_s)
    raise TransferError("malformed", 0, f"unknown transport {ep.transport!r} in the endpoint")
