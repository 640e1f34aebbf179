"""Two or more workers' gRPC servers in this process, each with its own service credential,
and fetch tickets minted the way the metadata service mints them."""
from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc

from kvmesh.hashing import block_hashes
from kvmesh.transfer import ticket
from kvmesh.v1 import index_pb2, worker_pb2, worker_pb2_grpc
from worker import Engine
from worker.engine.async_engine import AsyncEngine
from worker.rpc.server import WorkerServicer, create_server

BS = 16


@dataclass
class Peer:
    worker_id: str
    credential: str  # what it presents to the service
    address: str
    stub: worker_pb2_grpc.WorkerServiceStub
    servicer: WorkerServicer

    @property
    def engine(self) -> Engine:
        return self.servicer.runner.engine


def mint(source: Peer, requester: Peer | str, hashes: Sequence[bytes], *,
         requester_credential: str | None = None, ttl_s: float = 30.0,
         now_ms: int | None = None) -> bytes:
    """The service's ticket letting ``requester`` fetch ``hashes`` from ``source``."""
    rid = requester if isinstance(requester, str) else requester.worker_id
    cred = requester_credential if requester_credential is not None else requester.credential
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return ticket.mint(ticket.peer_key(source.credential), ticket.peer_key(cred), rid,
                       source.worker_id, list(hashes), now, ttl_s)


def chain(prompt: list[int], engine: Engine, **keys) -> list[bytes]:
    return block_hashes(prompt, engine.block_size, algo=engine.kv.hash_algo,
                        seed=engine.kv.hash_seed, **keys)


def plan(source: Peer, requester: Peer, prompt: list[int], start: int, n: int,
         **keys) -> index_pb2.FetchPlan:
    hashes = chain(prompt, requester.engine, **keys)[start:start + n]
    return index_pb2.FetchPlan(source_worker_id=source.worker_id,
                               source_address=source.address, start_block=start,
                               block_hashes=hashes, tokens=n * BS, est_s=0.01,
                               ticket=mint(source, requester, hashes))


def generate_request(prompt: list[int], max_tokens: int = 6,
                     fetch: index_pb2.FetchPlan | None = None,
                     **kw) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(
        token_ids=prompt, sampling=worker_pb2.SamplingParams(max_tokens=max_tokens,
                                                             ignore_eos=True),
        fetch=fetch, **kw)


async def generate(peer: Peer, request: worker_pb2.GenerateRequest,
                   metadata=None) -> worker_pb2.GenerateResponse:
    """The final message, its token ids all the streamed ones."""
    tokens: list[int] = []
    async for msg in peer.stub.Generate(request, metadata=metadata):
        tokens += msg.token_ids
        if msg.finished:
            del msg.token_ids[:]
            msg.token_ids.extend(tokens)
            return msg
    raise AssertionError("the stream ended without a final message")


@contextlib.asynccontextmanager
async def peers(*specs: tuple[str, str, Engine], peer_fetch: Sequence[bool] = (),
                access_token: str | None = None,
                data_host: str | None = None) -> AsyncIterator[list[Peer]]:
    """Serve ``(worker_id, credential, engine)`` each; stopped (data planes too) after.
    ``data_host``: where their data planes listen (default loopback, plaintext)."""
    started: list[tuple[grpc.aio.Server, grpc.aio.Channel, Peer]] = []
    try:
        for i, (wid, cred, engine) in enumerate(specs):
            on = peer_fetch[i] if i < len(peer_fetch) else True
            server, port, servicer = await create_server(
                "127.0.0.1:0", AsyncEngine(engine).start(), worker_id=wid, model_name="tiny",
                credential=cred, peer_fetch=on, access_token=access_token,
                data_host=data_host)
            await server.start()
            address = f"127.0.0.1:{port}"
            channel = grpc.aio.insecure_channel(address)
            started.append((server, channel, Peer(
                wid, cred, address, worker_pb2_grpc.WorkerServiceStub(channel), servicer)))
        yield [p for _, _, p in started]
    finally:
        for server, channel, peer in started:
            await channel.close()
            await server.stop(None)
            await peer.servicer.close_peers()
            peer.servicer.runner.stop()
