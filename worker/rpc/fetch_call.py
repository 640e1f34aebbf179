"""``WorkerService.FetchBlocks``, the source side: serve a peer the blocks the service granted.

Refusals, each counted by reason: the peer switch off (FAILED_PRECONDITION, "off"); a
plaintext transport (grpc) asked of a data plane on an address other hosts reach
(FAILED_PRECONDITION, "plaintext": there only the CURVE-encrypted zmq socket serves); a
malformed request (INVALID_ARGUMENT, "malformed": no requester, no or odd hashes, too many,
an unknown transport); a ticket that does not grant this fetch (PERMISSION_DENIED, the
ticket's reason: "no_ticket", "malformed", "forged", "not_for_me", "hashes", "expired"). The
ticket is the credential: the auth interceptor lets every caller reach this handler, and a
router or client token without the requester's proof is refused here (``forged``).

Then the longest run of the asked hashes this worker holds is copied to host memory,
beside the engine's step in progress when the run is on the device
(``worker.engine.peer_read``), else on the engine thread between steps
(``worker.engine.peer_blocks.snapshot``: host and disk tiers); the header answers
(fingerprint, layout, blocks, token ids) and the bytes are offered, once, on the worker's
data plane (``kvmesh.transfer.transports.DataServer``, over the transport
asked for) at the endpoint the header names. The data plane starts with the first fetch
served and closes with the gRPC server (:meth:`PeerSource.close`).

See docs/architecture.md#peer-kv-transfer-the-worker-side.
"""
from __future__ import annotations

import asyncio
import logging
import time

import grpc

from kvmesh.transfer import ticket
from kvmesh.transfer.transports import DEFAULT_TRANSPORT, TRANSPORTS, DataServer
from kvmesh.v1 import worker_pb2
from worker.engine.async_engine import AsyncEngine
from worker.engine.peer_blocks import layout, snapshot
from worker.engine.peer_read import read_beside
from worker.rpc.peer_stats import PeerCounters

log = logging.getLogger(__name__)

MAX_BLOCKS = 8192        # blocks one fetch may ask for
MAX_HASH_BYTES = 64
MAX_FETCH_BYTES = 1 << 30  # host memory one fetch may take on the source (a prefix beyond)
OFFER_TTL_S = 10.0       # an offer nobody pulls is dropped after this long


class Refused(Exception):
    """A fetch this source does not serve: ``code``, ``reason`` (a metric label), message."""

    def __init__(self, code: grpc.StatusCode, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


def check(request: worker_pb2.FetchBlocksRequest, key: bytes, worker_id: str,
          now_ms: int) -> str:
    """The transport to serve ``request`` over, or :class:`Refused`."""
    hashes = list(request.block_hashes)
    if not request.requester_id or len(request.requester_id.encode()) > ticket.MAX_ID_BYTES:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "malformed",
                      "requester_id must name the fetching worker (1..1024 bytes)")
    if not hashes or len(hashes) > MAX_BLOCKS:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "malformed",
                      f"ask for 1..{MAX_BLOCKS} block hashes, not {len(hashes)}")
    if len({len(h) for h in hashes}) != 1 or not 0 < len(hashes[0]) <= MAX_HASH_BYTES:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "malformed",
                      f"block hashes must all have one size of 1..{MAX_HASH_BYTES} bytes")
    transport = request.transport or DEFAULT_TRANSPORT
    if transport not in TRANSPORTS:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "malformed",
                      f"unknown transport {request.transport!r}; transports are "
                      f"{', '.join(TRANSPORTS)}")
    if not request.ticket:
        raise Refused(grpc.StatusCode.PERMISSION_DENIED, "no_ticket",
                      "FetchBlocks needs the ticket of the route that planned the fetch "
                      "(FetchPlan.ticket) and the requester's proof")
    try:
        ticket.verify(key, request.ticket, request.proof, source=worker_id,
                      requester=request.requester_id, block_hashes=hashes, now_ms=now_ms)
    except ticket.TicketError as e:
        raise Refused(grpc.StatusCode.PERMISSION_DENIED, e.reason, str(e)) from None
    return transport


class PeerSource:
    """The source side of one worker: its peer key, its switch, its data plane (started on
    first use, closed with the server) and its counters."""

    def __init__(self, runner: AsyncEngine, *, credential: str | None, enabled: bool,
                 host: str, counters: PeerCounters) -> None:
        self.runner = runner
        self.key = ticket.peer_key(credential)
        self.enabled = enabled
        self.host = host
        self.counters = counters
        self._data: DataServer | None = None
        self._starting = asyncio.Lock()

    async def close(self) -> None:
        """Stop the data plane (pulls in flight end, failed, on the receiver's side)."""
        if self._data is not None:
            data, self._data = self._data, None
            await data.close()

    async def serve(self, request: worker_pb2.FetchBlocksRequest,
                    worker_id: str) -> worker_pb2.FetchBlocksResponse:
        """The header naming where the bytes wait. Raises :class:`Refused`."""
        t0 = time.perf_counter()
        try:
            if not self.enabled:
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION, "off",
                              f"worker {worker_id} does not serve peer fetches "
                              "(--no-peer-fetch)")
            transport = check(request, self.key, worker_id, int(time.time() * 1000))
            data = await self.data_server()
            if transport not in data.transports:
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION, "plaintext",
                              f"worker {worker_id} serves KV on {self.host}, which other "
                              f"hosts reach, only encrypted: ask for one of "
                              f"{', '.join(data.transports)}, not {transport}")
        except Refused as e:
            self.counters.refuse(e.reason)
            raise
        engine = self.runner.engine
        lay, fingerprint = layout(engine), engine.fingerprint  # fixed for the engine's life
        # at most MAX_FETCH_BYTES of host copies per fetch: a prefix of it
        hashes = list(request.block_hashes)[:max(1, MAX_FETCH_BYTES // lay.block_bytes)]
        c = self.counters
        # beside the step in progress (the holder is busy when a fetch is planned); on the
        # engine thread, between steps, only when the run goes on in a lower tier
        snap = await asyncio.to_thread(read_beside, engine, hashes)
        if snap is None:
            c.engine_reads += 1
            snap = await self.runner.call(lambda e: snapshot(e, hashes))
        endpoint = ""
        if snap.count:
            def done(outcome: str) -> None:  # blocks and bytes count once they all left
                if outcome == "sent":
                    c.served_blocks += snap.count
                    c.served_bytes += snap.count * lay.block_bytes

            endpoint = data.offer(transport, snap.blocks(), OFFER_TTL_S, on_done=done)
        c.served += 1
        c.latency.observe("source", max(snap.count, 1), time.perf_counter() - t0)
        return worker_pb2.FetchBlocksResponse(
            fingerprint=fingerprint, blocks=snap.count, block_bytes=lay.block_bytes,
            token_ids=snap.token_ids, endpoint=endpoint, dtype=lay.dtype,
            block_shape=lay.block_shape)

    async def data_server(self) -> DataServer:
        """The data plane, started on first use (a fetch served or the start calibration)."""
        async with self._starting:
            if self._data is None:
                data = DataServer(self.host)
                await data.start()
                self._data = data
                # operators must see whether prompts' KV crosses their network in the clear
                log.info("peer KV data plane on %s: %s (transports %s)", self.host,
                         "CURVE-encrypted" if data.encrypt else "plaintext, loopback only",
                         ", ".join(data.transports))
        return self._data
