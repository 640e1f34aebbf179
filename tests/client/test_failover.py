"""A kvmesh client never calls ``WorkerService`` on an HTTP engine: those candidates are
skipped (and named in the error when nothing else is left)."""
from __future__ import annotations

import grpc
import pytest

from client.errors import KvmeshError
from client.failover import Candidates
from client.results import Candidate, RouteResult
from kvmesh.v1 import worker_pb2


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
