"""The CPU tier on a real cluster: a worker whose device pool evicted a prompt still holds it
in host memory, the index says so (a CPU-tier match), routing prefers it over a cold worker,
and the answer it serves from the onboarded blocks is token for token the cold worker's.

Real Valkey, a real service process and two real worker processes (``kvmesh up``'s local
backend), each with a device pool of 16 blocks and a CPU tier of 64.
"""
from __future__ import annotations

import random

import grpc

from deploy.local import ClusterSpec, LocalCluster
from deploy.waiting import wait_until
from kvmesh.v1 import worker_pb2, worker_pb2_grpc
from worker.kv_cache.tier_config import TierConfig

BLOCK = 16


def _direct(address: str, prompt: list[int]) -> tuple[list[int], int]:
    """Generate on one worker, bypassing the router (an open cluster: no token): the
    streamed tokens and the number of cached prompt tokens."""
    tokens: list[int] = []
    with grpc.insecure_channel(address) as ch:
        for msg in worker_pb2_grpc.WorkerServiceStub(ch).Generate(worker_pb2.GenerateRequest(
                token_ids=prompt, sampling=worker_pb2.SamplingParams(max_tokens=6))):
            tokens += msg.token_ids
            if msg.finished:
                return tokens, msg.num_cached_tokens
    raise AssertionError("the stream ended without a final message")


def test_routing_prefers_a_cpu_tier_holder_and_the_output_is_identical() -> None:
    rng = random.Random(7)
    prompt = [rng.randrange(256) for _ in range(4 * BLOCK + 3)]
    cluster = LocalCluster(ClusterSpec(workers=2, num_blocks=16, tiers=TierConfig(cpu_blocks=64),
                                       heartbeat_s=0.2)).start()
    try:
        with cluster.client() as client:
            first = client.generate(prompt, max_tokens=6)
            holder = next(w for w in client.stats()["workers"]
                          if w["worker_id"] == first.worker_id)
            cold = next(w for w in client.stats()["workers"]
                        if w["worker_id"] != first.worker_id)
            # Push the prompt out of the holder's device pool (16 blocks): other prompts,
            # sent to the holder directly so the router cannot spread them.
            for _ in range(4):
                _direct(holder["address"], [rng.randrange(256) for _ in range(5 * BLOCK)])

            def cpu_match() -> dict[str, int] | None:
                res = client.route(prompt, dry_run=True)
                by_worker = {c.worker_id: c.matched_tokens_by_tier for c in res.candidates}
                tiers = by_worker.get(first.worker_id, {})
                return tiers if tiers.get("cpu", 0) > 0 else None

            tiers = wait_until(cpu_match, 30, what="the index shows a CPU-tier match")
            assert sum(tiers.values()) == 4 * BLOCK
            best = client.route(prompt, dry_run=True)
            assert best.worker_id == first.worker_id, best  # the CPU holder beats a cold one

            again = client.generate(prompt, max_tokens=6)
            assert again.worker_id == first.worker_id
            assert again.cached_tokens_by_tier.get("cpu", 0) > 0, again
            assert again.num_cached_tokens == 4 * BLOCK
            assert again.token_ids == first.token_ids

        tokens, cached = _direct(cold["address"], prompt)  # the cold worker computes it all
        assert cached == 0
        assert tokens == first.token_ids
    finally:
        cluster.stop()
