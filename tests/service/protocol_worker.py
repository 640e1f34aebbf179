"""A protocol worker (a fake that speaks the worker side of IndexService over real gRPC; no
cache, no model: not the replay's simulated worker, ``bench.replay.cluster.SimWorker``) and a
running service, for the integration tests. The protocol worker holds whole prompt chains and
publishes exactly what a real worker would: BlockStored / BlockRemoved with per-worker seqs.
"""
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc

from kvmesh.hashing import block_hashes, none_hash
from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc as pb_grpc
from service.clock import Clock, wall_ms
from service.config import ServiceConfig
from service.index import IndexBackend
from service.server import IndexServer, create_server

BS = 4  # block size of the tests: small prompts, several blocks


@dataclass
class Running:
    server: IndexServer
    address: str
    channel: grpc.aio.Channel
    stub: pb_grpc.IndexServiceStub


@contextlib.asynccontextmanager
async def serve(config: ServiceConfig, backend: IndexBackend | None = None,
                token: str | None = None, clock: Clock = wall_ms) -> AsyncIterator[Running]:
    """A started service (reading ``clock``) on a free loopback port and a client stub."""
    server, port = await create_server("127.0.0.1:0", config, backend, clock)
    await server.start()
    address = f"127.0.0.1:{port}"
    channel = grpc.aio.insecure_channel(address)
    try:
        yield Running(server, address, channel, stub(channel))
    finally:
        await channel.close()
        await server.stop(None)


def stub(channel: grpc.aio.Channel) -> pb_grpc.IndexServiceStub:
    return pb_grpc.IndexServiceStub(channel)


def meta(token: str | None) -> tuple[tuple[str, str], ...] | None:
    return None if token is None else (("authorization", f"Bearer {token}"),)


def prompt(n_tokens: int, start: int = 1) -> list[int]:
    return list(range(start, start + n_tokens))


class ProtocolWorker:
    """Registers, heartbeats and publishes like a worker; remembers what it holds."""

    def __init__(self, stub: pb_grpc.IndexServiceStub, worker_id: str, *, model: str = "tiny",
                 block_size: int = BS, algo: str = "sha256_cbor", seed: str | None = None,
                 token: str | None = None, port: int = 9000, incarnation: int = 0) -> None:
        self.stub, self.worker_id, self.model = stub, worker_id, model
        self.incarnation = incarnation
        self.block_size, self.algo, self.seed = block_size, algo, seed
        self.address = f"127.0.0.1:{port}"
        self.metadata = meta(token)
        self.seq = 0
        self.chains: dict[bytes, list[bytes]] = {}  # first hash -> chain held

    def hashes(self, tokens: Sequence[int], salt: str | None = None) -> list[bytes]:
        return block_hashes(tokens, self.block_size, algo=self.algo, seed=self.seed, salt=salt)

    async def register(self, **load: int) -> pb.RegisterWorkerResponse:
        return await self.stub.RegisterWorker(pb.RegisterWorkerRequest(
            worker_id=self.worker_id, address=self.address, model=self.model,
            block_size=self.block_size, hash_algo=self.algo,
            root_hash=none_hash(self.algo, self.seed), load=pb.WorkerLoad(**load),
            incarnation=self.incarnation), metadata=self.metadata)

    async def heartbeat(self, **load: int) -> pb.HeartbeatResponse:
        return await self.stub.Heartbeat(pb.HeartbeatRequest(
            worker_id=self.worker_id, load=pb.WorkerLoad(**load), last_seq=self.seq,
            incarnation=self.incarnation), metadata=self.metadata)

    async def publish(self, *events: pb.KvEvent) -> pb.PublishEventsResponse:
        return await self.stub.PublishEvents(pb.PublishEventsRequest(
            worker_id=self.worker_id, events=list(events), incarnation=self.incarnation),
            metadata=self.metadata)

    def next_event(self, **kind: object) -> pb.KvEvent:
        self.seq += 1
        return pb.KvEvent(seq=self.seq, **kind)  # type: ignore[arg-type]

    async def store(self, tokens: Sequence[int], salt: str | None = None,
                    tier: int = pb.TIER_GPU) -> list[bytes]:
        """Hold the whole chain of ``tokens`` and publish it; returns its hashes."""
        chain = self.hashes(tokens, salt)
        self.chains[chain[0]] = chain
        ev = self.next_event(stored=pb.BlockStored(block_hashes=chain, tier=tier))
        res = await self.publish(ev)
        assert not res.resync, res
        return chain

    async def evict_tail(self, chain: list[bytes], n: int = 1) -> pb.PublishEventsResponse:
        """Evict the last ``n`` blocks of a held chain (tail first, like the block pool)."""
        gone = chain[-n:]
        del chain[-n:]
        ev = self.next_event(removed=pb.BlockRemoved(block_hashes=gone[::-1], tier=pb.TIER_GPU))
        return await self.publish(ev)

    async def sync(self) -> pb.SyncWorkerResponse:
        blocks = [pb.BlockStored(block_hashes=c, tier=pb.TIER_GPU)
                  for c in self.chains.values() if c]
        return await self.stub.SyncWorker(pb.SyncWorkerRequest(
            worker_id=self.worker_id, seq=self.seq, blocks=blocks, incarnation=self.incarnation),
            metadata=self.metadata)

    async def join(self, **load: int) -> None:
        """Register and answer the resync request with a snapshot, as a worker must."""
        res = await self.register(**load)
        if res.resync:
            await self.sync()


async def route(stub: pb_grpc.IndexServiceStub, tokens: Sequence[int], token: str | None = None,
                **kw: object) -> pb.RouteResponse:
    return await stub.Route(pb.RouteRequest(token_ids=list(tokens), **kw),  # type: ignore[arg-type]
                            metadata=meta(token))
