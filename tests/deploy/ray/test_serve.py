"""deploy.ray.serve: a Serve replica follows the fetch plan the kvmesh router attached for ITS
worker (``fetch_plan_for``) through the gRPC Generate's receiver path: the prefix comes from
the holder ("peer" tokens), the output is the holder's; another worker's plan is ignored.
Runs two hosted workers in this process (the replica's code without Ray Serve: a fixed
host, cpu, no service) with tickets minted as the service mints them."""
from __future__ import annotations

import asyncio
import time

from deploy.ray.request import ServeRequest
from deploy.ray.serve import KvmeshReplica
from deploy.ray.worker_host import WorkerConfig, WorkerHost
from kvmesh.hashing import block_hashes
from kvmesh.transfer import ticket
from kvmesh.v1 import index_pb2

CREDS = {"w0": "cred-w0-5a1d", "w1": "cred-w1-c3e0"}
PROMPT = [(13 * i) % 250 + 1 for i in range(6 * 16 + 5)]
OTHER = [(7 * i) % 250 + 1 for i in range(6 * 16 + 5)]
# the replica's class without Serve; its async __del__ (stopping the host) is the test's job
_Replica = type("Replica", (KvmeshReplica.func_or_class,), {"__del__": lambda self: None})


def _replica(host: WorkerHost):
    replica = _Replica.__new__(_Replica)
    replica.worker_id, replica._host = host.config.worker_id, host
    return replica


async def _generate(replica, request: ServeRequest) -> tuple[list[int], dict]:
    tokens: list[int] = []
    async for chunk in replica.generate(request):
        tokens += chunk["token_ids"]
        if chunk.get("finished"):
            return tokens, chunk
    raise AssertionError("no final chunk")


def _plan(src: WorkerHost, dst: WorkerHost, blocks: int, prompt: list[int] = PROMPT) -> bytes:
    engine = dst.runner.engine
    hashes = block_hashes(prompt, 16, algo=engine.kv.hash_algo,
                          seed=engine.kv.hash_seed)[:blocks]
    tkt = ticket.mint(ticket.peer_key(CREDS["w0"]), ticket.peer_key(CREDS["w1"]), "w1", "w0",
                      hashes, int(time.time() * 1000))
    return index_pb2.FetchPlan(source_worker_id="w0", source_address=src.address,
                               start_block=0, block_hashes=hashes, tokens=blocks * 16,
                               est_s=0.05, ticket=tkt).SerializeToString()


def test_a_replica_follows_its_own_plan_and_ignores_another_workers() -> None:
    async def main() -> None:
        hosts = [await WorkerHost(WorkerConfig(
            worker_id=w, services=(), num_blocks=64, device="cpu", host="127.0.0.1",
            service_token=CREDS[w])).start() for w in ("w0", "w1")]
        src, dst = hosts
        try:
            want, first = await _generate(_replica(src), ServeRequest(PROMPT, max_tokens=4))
            assert first["cached_tokens_by_tier"].get("peer", 0) == 0
            got, final = await _generate(_replica(dst), ServeRequest(
                PROMPT, max_tokens=4, fetch={"w1": _plan(src, dst, 6)}))
            assert got == want and final["cached_tokens_by_tier"]["peer"] == 6 * 16
            assert dst.servicer.peer.fetches == 1 and src.servicer.peer.served == 1
            # only another worker's plan: this replica recomputes, with the same output
            other, _ = await _generate(_replica(src), ServeRequest(OTHER, max_tokens=4))
            got, final = await _generate(_replica(dst), ServeRequest(
                OTHER, max_tokens=4, fetch={"w9": _plan(src, dst, 6, OTHER)}))
            assert got == other and final["num_cached_tokens"] == 0
            assert dst.servicer.peer.fetches == 1 and src.servicer.peer.served == 1
        finally:
            for h in hosts:
                await h.stop()

    asyncio.run(main())
