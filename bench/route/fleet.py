"""The protocol fleet of `kvmesh bench route`: fake workers (no cache, no model) that speak
the worker side of IndexService over real gRPC, and the prompts they hold (see
:func:`index_prompts`)."""
from __future__ import annotations

import math
import random
import threading
from typing import Any

from kvmesh.contract import DEFAULT_ALGO

SIZES = (16, 2048, 8192)
BLOCK_SIZE = 16
ALGO = DEFAULT_ALGO
VOCAB = 128_256


class ProtocolFleet:
    """``n`` protocol workers on one service: register, index chains, heartbeat.

    Contract: after :meth:`start` every worker is registered (and has answered the resync
    request with an empty snapshot); a daemon thread heartbeats all of them every 0.5 s with
    their true last seq, so they stay live for routing until :meth:`stop`.
    """

    def __init__(self, address: str, n: int, model: str = "tiny") -> None:
        import grpc

        from kvmesh.v1 import index_pb2_grpc

        self.channel = grpc.insecure_channel(address)
        self.stub = index_pb2_grpc.IndexServiceStub(self.channel)
        self.ids = [f"sim-{i}" for i in range(n)]
        self.model = model
        self.seq = dict.fromkeys(self.ids, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def _load(self) -> Any:
        from kvmesh.v1 import index_pb2 as pb

        return pb.WorkerLoad(free_blocks=900_000, total_blocks=1_000_000)

    def start(self) -> ProtocolFleet:
        from kvmesh.hashing import none_hash
        from kvmesh.v1 import index_pb2 as pb

        for i, wid in enumerate(self.ids):
            res = self.stub.RegisterWorker(pb.RegisterWorkerRequest(
                worker_id=wid, address=f"127.0.0.1:{20000 + i}", model=self.model,
                block_size=BLOCK_SIZE, hash_algo=ALGO, root_hash=none_hash(ALGO),
                load=self._load()))
            if res.resync:
                self.stub.SyncWorker(pb.SyncWorkerRequest(worker_id=wid, seq=0))
        self._thread.start()
        return self

    def store(self, worker_id: str, chain: list[bytes]) -> None:
        """Publish one BlockStored of ``chain`` (from block 0) for ``worker_id``."""
        from kvmesh.v1 import index_pb2 as pb

        self.seq[worker_id] += 1
        ev = pb.KvEvent(seq=self.seq[worker_id], stored=pb.BlockStored(
            block_hashes=chain, tier=pb.TIER_GPU))
        res = self.stub.PublishEvents(pb.PublishEventsRequest(worker_id=worker_id,
                                                              events=[ev]))
        if res.resync or res.applied != 1:
            raise RuntimeError(f"publish for {worker_id} not applied: {res}")

    def _beat(self) -> None:
        from kvmesh.v1 import index_pb2 as pb

        while not self._stop.wait(0.5):
            for wid in self.ids:
                try:
                    self.stub.Heartbeat(pb.HeartbeatRequest(
                        worker_id=wid, load=self._load(), last_seq=self.seq[wid]), timeout=2)
                except Exception:  # a missed beat only matters if 3 s of them are missed
                    pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2)
        self.channel.close()


def make_prompts(sizes: tuple[int, ...], seed: int) -> dict[int, list[int]]:
    """One seeded prompt of random token ids (a Llama-3-sized vocabulary) per size."""
    rng = random.Random(seed)
    return {n: [rng.randrange(VOCAB) for _ in range(n)] for n in sizes}


def index_prompts(fleet: ProtocolFleet, prompts: dict[int, list[int]]) -> dict[int, list[bytes]]:
    """Worker i of W holds the first ceil((i+1)/W) of every prompt's chain."""
    from kvmesh.hashing import block_hashes

    chains = {n: block_hashes(p, BLOCK_SIZE, algo=ALGO) for n, p in prompts.items()}
    w = len(fleet.ids)
    for i, wid in enumerate(fleet.ids):
        for chain in chains.values():
            fleet.store(wid, chain[:max(1, math.ceil((i + 1) * len(chain) / w))])
    return chains
