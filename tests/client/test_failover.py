"""A kvmesh client never calls ``WorkerService`` on an HTTP engine: those candidates are
skipped (and named in the error when nothing else is left)."""
from __future__ import annotations

import grpc
import pytest

from client.errors import KvmeshError
from client.failover import Candidates
from client.results import Candidate, RouteResult
from kvmesh.v1 import index_pb2, worker_pb2


def routed(*addresses: str) -> RouteResult:
    cands = [Candidate(f"w{i}", a, 0, float(i)) for i, a in enumerate(addresses)]
    return RouteResult(cands[0].worker_id, cands[0].address, 0, cands)


def test_http_engines_are_skipped_in_ranking_order() -> None:
    plan = Candidates(routed("http://e:8000", "g:1", "https://f:8443", "h:2"),
                      worker_pb2.GenerateRequest(), stream=False)
    assert [a.cand.address for a in plan] == ["g:1", "h:2"]


def test_a_fleet_of_http_engines_only_is_an_unavailable_error_naming_them() -> None:
    plan = Candidates(routed("http://e:8000"), worker_pb2.GenerateRequest(), stream=False)
    assert list(plan) == []
    err = plan.error()
    assert isinstance(err, KvmeshError) and err.code == grpc.StatusCode.UNAVAILABLE
    assert "http://e:8000" in str(err)


@pytest.mark.parametrize("address", ["e:8000", "[::1]:1"])
def test_grpc_workers_are_tried(address: str) -> None:
    plan = Candidates(routed(address), worker_pb2.GenerateRequest(), stream=False)
    assert [a.cand.address for a in plan] == [address]


def test_a_routed_answer_is_used_as_is_without_routing_again(cluster, make_client) -> None:
    """The gateway routes once (to see whether an HTTP engine is best) and hands the answer
    to ``generate``: no second Route, and only the kvmesh workers in it are called."""
    from tests.client.fake_servers import FakeIndex, FakeWorker

    index, worker = FakeIndex(), FakeWorker("w1")
    client = make_client(cluster.index(index))
    address = cluster.worker(worker)
    result = client.generate([1, 2, 3], max_tokens=2,
                             routed=routed("http://engine:8000", address))
    assert index.routes == [] and result.worker_id == "w1" and len(worker.requests) == 1


def plan_of(source: str, start: int) -> index_pb2.FetchPlan:
    return index_pb2.FetchPlan(source_worker_id=source, source_address=f"{source}:1",
                               start_block=start, block_hashes=[bytes([start]) * 32] * 3,
                               tokens=48, est_s=0.004, ticket=source.encode() * 20)


def test_each_worker_gets_its_own_candidates_fetch_plan_and_worker_id_reaches_route(
        cluster, make_client) -> None:
    """w1 and w2 (each with its own plan) fail before any token; w3 (no plan) answers:
    each GenerateRequest carries the plan of the candidate it went to, none for w3. Both
    clients, over real gRPC; ``worker_id`` goes out in the RouteRequest."""
    from tests.client.fake_servers import FakeIndex, FakeWorker, candidate

    workers = [FakeWorker(f"w{i}", mode="fail") for i in (1, 2)] + [FakeWorker("w3")]
    for w in workers[:2]:
        w.failure = (grpc.StatusCode.UNAVAILABLE, "down")
    addresses = [cluster.worker(w) for w in workers]
    plans = [plan_of("h1", 2), plan_of("h2", 5), None]
    cands = [candidate(w.worker_id, a, matched=48) for w, a in
             zip(workers, addresses, strict=True)]
    for c, p in zip(cands, plans, strict=True):
        if p is not None:
            c.fetch.CopyFrom(p)
    index = FakeIndex(cands)
    client = make_client(cluster.index(index))
    routed_answer = client.route([1, 2, 3], worker_id="w2")
    assert index.routes[-1].worker_id == "w2"
    first = routed_answer.candidates[0].fetch
    assert (first.source_worker_id, first.start_block, first.blocks, first.ticket) == (
        "h1", 2, 3, b"h1" * 20)
    assert routed_answer.candidates[2].fetch is None
    result = client.generate([1, 2, 3], max_tokens=2, worker_id="w3")
    assert index.routes[-1].worker_id == "w3"
    assert result.worker_id == "w3" and result.attempts == 3
    sent = [w.requests[0] for w in workers]
    assert sent[0].fetch == plans[0] and sent[1].fetch == plans[1]
    assert not sent[2].HasField("fetch")
    assert client.generate([1, 2, 3], max_tokens=2) and index.routes[-1].worker_id == ""
