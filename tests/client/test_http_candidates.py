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
