"""A ``GenerateRequest.fetch`` plan, the receiver side: pull the planned blocks from the
source, verify them, and hand the Generate call what landed to import before admission.

In order, each failure a counted fallback (by reason) after which the request recomputes:
the plan must name blocks of this prompt by THIS worker's own chain hashes (its salt, LoRA,
multimodal items and seed; "plan" / "hashes"); the source answers FetchBlocks with the
ticket and this worker's proof (``kvmesh.transfer.ticket.proof``; "refused", "unavailable",
"timeout", "error"); its header must carry this worker's model fingerprint ("fingerprint"),
block layout ("layout"), and the prompt's token ids for the blocks it sends ("tokens"); a
source that no longer holds the first block sends none ("evicted"); the bytes are pulled
with a deadline, and a transfer that stops half way keeps the whole blocks that landed
("partial" or the transport's reason). The landed prefix is imported on the engine thread
in the same call that queues the request (:meth:`Landed.import_into`).

See docs/architecture.md#peer-kv-transfer-the-worker-side.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from kvmesh.hashing import Lora, MMItem, block_hashes
from kvmesh.rpc.channel import Dialer
from kvmesh.transfer import ticket
from kvmesh.transfer.transports import TransferError, pull
from kvmesh.v1 import index_pb2, worker_pb2, worker_pb2_grpc
from worker.engine.async_engine import AsyncEngine
from worker.engine.engine import Engine
from worker.engine.peer_blocks import Layout, import_landed, layout
from worker.engine.sequence import Seq
from worker.rpc.peer_stats import PeerCounters

log = logging.getLogger("kvmesh.worker.peer")

MIN_TIMEOUT_S = 2.0   # a fetch's deadline: this, or 4x the route's estimate if longer
MAX_TIMEOUT_S = 30.0
MAX_CHANNELS = 64     # sources this worker keeps a channel to
_CODES = {grpc.StatusCode.UNAVAILABLE: "unavailable",
          grpc.StatusCode.DEADLINE_EXCEEDED: "timeout",
          grpc.StatusCode.PERMISSION_DENIED: "refused",
          grpc.StatusCode.FAILED_PRECONDITION: "refused",
          grpc.StatusCode.INVALID_ARGUMENT: "refused",
          grpc.StatusCode.UNAUTHENTICATED: "refused"}


@dataclass
class Landed:
    """Chain blocks ``[start, start + count)`` of the prompt, their KV in ``data``."""

    start: int
    count: int
    data: bytearray
    call_s: float   # the control call, to its header
    pull_s: float   # the bytes
    began: float    # perf_counter when the fetch began: the request's arrival

    def import_into(self, counters: PeerCounters):
        """The ``on_enqueued`` hook importing these blocks for the queued request."""

        def run(engine: Engine, seq: Seq) -> None:
            seq.arrival = self.began  # its time to first token includes the fetch
            engine.costs.fetch(self.count, self.call_s, self.pull_s)
            try:
                n = import_landed(engine, seq.req, self.start, self.data, self.count)
            except Exception:
                counters.fallback("import")
                raise
            counters.fetched_blocks += n
            if n:  # the load's queued prefill: these tokens will not be computed
                seq.expected_cached = max(seq.expected_cached,
                                          sum(engine.kv.match_by_tier(seq.req).values()))

        return run


class PeerFetcher:
    """The receiver side of one worker: its id and proof key, dialer and switch."""

    def __init__(self, runner: AsyncEngine, *, credential: str | None, enabled: bool,
                 dialer: Dialer | None, counters: PeerCounters, transport: str = "") -> None:
        self.runner = runner
        self.key = ticket.peer_key(credential)
        self.enabled = enabled
        self.dialer = dialer or Dialer()
        self.counters = counters
        self.transport = transport  # "": the source's default
        self._own: tuple[bytes, Layout] | None = None
        # one channel per source, kept: a fetch's control call pays no connection set-up
        self._channels: OrderedDict[str, grpc.aio.Channel] = OrderedDict()

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), OrderedDict()
        for channel in channels:
            await channel.close()

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.pop(address, None) or self.dialer.aio(address)
        self._channels[address] = channel
        if len(self._channels) > MAX_CHANNELS:  # the least recently used source's goes
            _, old = self._channels.popitem(last=False)
            asyncio.get_running_loop().create_task(old.close())
        return channel

    async def fetch(self, plan: index_pb2.FetchPlan, prompt: Sequence[int], *,
                    worker_id: str, salt: str | None, lora: Lora | None,
                    mm: tuple[MMItem, ...]) -> Landed | None:
        """The blocks of ``plan`` that landed and verified, or ``None`` (nothing to
        import: the request recomputes; the reason is counted)."""
        if not self.enabled:
            return None
        began = time.perf_counter()
        engine = self.runner.engine
        bs, n, start = engine.block_size, len(plan.block_hashes), plan.start_block
        if (not plan.source_address or not plan.source_worker_id or not n
                or (start + n) * bs > len(prompt) or plan.source_worker_id == worker_id):
            self.counters.fallback("plan")
            return None
        own = block_hashes(prompt[:(start + n) * bs], bs, algo=engine.kv.hash_algo,
                           seed=engine.kv.hash_seed, salt=salt, lora=lora, mm=mm)
        if list(plan.block_hashes) != own[start:start + n]:
            self.counters.fallback("hashes")
            return None
        fingerprint, lay = await self._own_layout()
        deadline = began + min(MAX_TIMEOUT_S, max(MIN_TIMEOUT_S, 4 * plan.est_s))
        landed = await self._pull(plan, worker_id, prompt, fingerprint, lay, began, deadline)
        self.counters.latency.observe("receiver", max(landed.count if landed else 0, 1),
                                      time.perf_counter() - began)
        return landed

    async def _own_layout(self) -> tuple[bytes, Layout]:
        if self._own is None:
            self._own = await self.runner.call(lambda e: (e.fingerprint, layout(e)))
        return self._own

    async def _header(self, plan: index_pb2.FetchPlan, worker_id: str,
                      deadline: float) -> worker_pb2.FetchBlocksResponse | str:
        """The source's header, or the fallback reason."""
        request = worker_pb2.FetchBlocksRequest(
            requester_id=worker_id, block_hashes=plan.block_hashes, ticket=plan.ticket,
            proof=ticket.proof(self.key, plan.ticket) if plan.ticket else b"",
            transport=self.transport)
        try:
            call = worker_pb2_grpc.WorkerServiceStub(self._channel(plan.source_address)) \
                .FetchBlocks(request, timeout=max(0.05, deadline - time.perf_counter()))
            head = await call.read()
        except grpc.aio.AioRpcError as e:
            log.info("peer fetch from %s failed (%s): recomputing", plan.source_worker_id,
                     e.details())
            return _CODES.get(e.code(), "error")
        return "error" if head is grpc.aio.EOF else head

    async def _pull(self, plan: index_pb2.FetchPlan, worker_id: str, prompt: Sequence[int],
                    fingerprint: bytes, lay: Layout, began: float,
                    deadline: float) -> Landed | None:
        c, bs, start = self.counters, self.runner.engine.block_size, plan.start_block
        head = await self._header(plan, worker_id, deadline)
        reason = head if isinstance(head, str) else _verify(
            head, fingerprint, lay, prompt, start, bs, len(plan.block_hashes))
        if reason:
            c.fallback(reason)
            return None
        header_at = time.perf_counter()
        c.fetches += 1
        data = bytearray(head.blocks * lay.block_bytes)
        count, reason = await self._bytes(head, data, lay.block_bytes,
                                          max(0.05, deadline - header_at))
        if not reason and head.blocks < len(plan.block_hashes):
            reason = "evicted"  # the source held only a prefix of the plan
        if reason:
            c.fallback(reason)
        c.fetched_bytes += count * lay.block_bytes
        if not count:
            return None
        return Landed(start, count, data, header_at - began, time.perf_counter() - header_at,
                      began)

    async def _bytes(self, head: worker_pb2.FetchBlocksResponse, data: bytearray,
                     block_bytes: int, timeout: float) -> tuple[int, str]:
        """Fill ``data`` from the header's endpoint; the whole blocks that landed and, if
        not all, why (the data plane's reason)."""
        if not head.endpoint:
            return 0, "error"
        view = memoryview(data)

        def sink(i: int, block: memoryview) -> None:
            view[i * block_bytes:(i + 1) * block_bytes] = block

        try:
            return await pull(head.endpoint, block_bytes, head.blocks, sink, timeout), ""
        except TransferError as e:
            return e.landed, e.reason


def _verify(head: worker_pb2.FetchBlocksResponse, fingerprint: bytes, lay: Layout,
            prompt: Sequence[int], start: int, bs: int, asked: int) -> str:
    """Why the header is refused ("" when it is not)."""
    if head.fingerprint != fingerprint:
        return "fingerprint"
    if (head.block_bytes != lay.block_bytes or tuple(head.block_shape) != lay.block_shape
            or head.dtype != lay.dtype or head.blocks > asked):
        return "layout"
    if list(head.token_ids) != list(prompt[start * bs:(start + head.blocks) * bs]):
        return "tokens"
    if not head.blocks:
        return "evicted"
    return ""
