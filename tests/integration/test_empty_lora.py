"""An empty-named Lora is matched by the index through a real cluster.

Real Redis, a real service process and a real worker process. The prompt runs once directly
on the worker (no Route, so no provisional entries stand in for the worker's own events);
afterwards the index must match it for the same request, which only happens when the worker
and the service hash the empty Lora the same way.
"""
from __future__ import annotations

import grpc
import pytest

from client import KvmeshClient
from deploy.local import ClusterSpec, LocalCluster
from deploy.waiting import wait_until
from kvmesh.v1 import index_pb2, worker_pb2, worker_pb2_grpc
from tests.cluster_scenarios import question

EMPTY = index_pb2.Lora()  # set, with an empty name and path


@pytest.fixture
def one_worker(redis_url):
    c = LocalCluster(ClusterSpec(workers=1, service_replicas=1, redis_url=redis_url,
                                 num_blocks=64, block_size=16))
    c.start(timeout=120)
    yield c
    c.stop()


def _matched(client: KvmeshClient, tokens: list[int], worker_id: str) -> int:
    for c in client.route(tokens, lora=EMPTY, dry_run=True).candidates:
        if c.worker_id == worker_id:
            return c.matched_tokens
    return 0


def test_empty_named_lora_is_matched_after_it_ran_once(one_worker):
    worker = one_worker.workers[0]
    prompt = question(11)  # 220 tokens: 13 full blocks
    with grpc.insecure_channel(worker.address) as ch:
        last = list(worker_pb2_grpc.WorkerServiceStub(ch).Generate(worker_pb2.GenerateRequest(
            token_ids=prompt, lora=EMPTY,
            sampling=worker_pb2.SamplingParams(max_tokens=2, ignore_eos=True))))[-1]
    assert last.finished and last.num_cached_tokens == 0
    with KvmeshClient(one_worker.service_addresses) as client:
        wait_until(lambda: _matched(client, prompt, worker.name) >= 208, timeout=10)
        assert _matched(client, prompt, worker.name) == 208
        again = client.generate(prompt, max_tokens=2, lora=EMPTY)
        assert again.worker_id == worker.name and again.num_cached_tokens == 208
