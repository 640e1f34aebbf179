"""Scripted ``WorkerService.Pin`` servers for the service's pin tests: each records the
PinRequests and credentials it receives and answers the blocks of the prefix (or refuses,
when told to). Paired with a ``ProtocolWorker`` registered at the same port, the service
sees a worker whose index entries the test writes and whose Pin calls it can read."""
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from kvmesh.v1 import worker_pb2, worker_pb2_grpc
from tests.service.protocol_worker import BS


@dataclass
class PinWorker(worker_pb2_grpc.WorkerServiceServicer):
    """``token``: the only bearer token accepted (None: any); ``refuse``: answer
    INVALID_ARGUMENT to every call."""

    token: str | None = None
    refuse: bool = False
    calls: list[worker_pb2.PinRequest] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    port: int = 0

    async def Pin(self, request: worker_pb2.PinRequest, context: grpc.aio.ServicerContext,
                  ) -> worker_pb2.PinResponse:
        auth = dict(context.invocation_metadata()).get("authorization", "")
        self.tokens.append(auth)
        if self.token is not None and auth != f"Bearer {self.token}":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "wrong pin token")
        self.calls.append(request)
        if self.refuse:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "refused by script")
        blocks = len(request.block_hashes) or len(request.token_ids) // BS
        return worker_pb2.PinResponse(pinned_blocks=blocks)


@contextlib.asynccontextmanager
async def pin_workers(*workers: PinWorker) -> AsyncIterator[tuple[PinWorker, ...]]:
    """Serve each of ``workers`` on its own free loopback port (set as ``.port``)."""
    servers = []
    try:
        for w in workers:
            server = grpc.aio.server()
            worker_pb2_grpc.add_WorkerServiceServicer_to_server(w, server)
            w.port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            servers.append(server)
        yield workers
    finally:
        for server in servers:
            await server.stop(None)
