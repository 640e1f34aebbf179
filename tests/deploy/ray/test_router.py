"""KvmeshRequestRouter's decisions, with fake replicas and a scripted index (no Ray needed).

The end-to-end path (real Serve replicas, a real index) is in tests/integration/ray/test_serve.py.
"""
from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from ray.serve._private.common import (
    DeploymentHandleSource,
    DeploymentID,
    ReplicaID,
    RequestMetadata,
)
from ray.serve._private.request_router.common import PendingRequest

from client.errors import KvmeshError
from client.results import Candidate, RouteResult
from deploy.ray.request import ServeRequest
from deploy.ray.router import KvmeshRequestRouter, request_prompt, serve_worker_id
from kvmesh.quota import check_tenant
from kvmesh.rpc.retry import TABLE, Source, retried
from service.validate import worker_id as check_worker_id

DEP = DeploymentID(name="LLM Server", app_name="my app")


class FakeReplica:
    """What the router reads of a Serve replica."""

    def __init__(self, uid: str) -> None:
        self.replica_id = ReplicaID(uid, DEP)
        self.node_id = "node"
        self.availability_zone = None
        self.multiplexed_model_ids: set[str] = set()
        self.max_ongoing_requests = 8

    async def get_queue_len(self, *, deadline_s: float) -> int:
        return 0


class ScriptedIndex:
    """Answers ``route`` from a script; records the calls."""

    def __init__(self, answer: RouteResult | Exception) -> None:
        self.answer = answer
        self.calls: list[tuple[list[int], str | None, bool]] = []
        self.tenants: list[str | None] = []

    async def route(self, tokens, salt=None, dry_run=False, tenant=None) -> RouteResult:
        self.calls.append((list(tokens), salt, dry_run))
        self.tenants.append(tenant)
        if tenant is not None:
            check_tenant(tenant)  # as the real client does, before any call
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def answer(*worker_ids: str, degraded: bool = False) -> RouteResult:
    cands = [Candidate(w, f"h:{i}", 16 * (3 - i), float(i)) for i, w in enumerate(worker_ids)]
    return RouteResult(worker_ids[0], "h:0", cands[0].matched_tokens, cands, degraded=degraded)


def pending(arg, rid: str = "req-1") -> PendingRequest:
    """A pending request (call on a running event loop: it owns a future)."""
    return PendingRequest(args=[arg], kwargs={},
                          metadata=RequestMetadata(request_id=rid, internal_request_id=rid))


def run(index: ScriptedIndex, requests: list[tuple], **kwargs):
    """Route ``requests`` ((arg, request id) pairs) in turn; returns the replicas, each
    decision's ranks as replica unique ids, and the router's counters."""

    async def main():
        router = KvmeshRequestRouter(deployment_id=DEP,
                                     handle_source=DeploymentHandleSource.UNKNOWN)
        router.initialize_state(service_addresses=["10.0.0.1:50051"], **kwargs)
        router._index = lambda: index
        replicas = [FakeReplica(u) for u in ("a1", "b2", "c3")]
        router.update_replicas(replicas)
        out = []
        for arg, rid in requests:
            ranks = await router.choose_replicas(router._replicas_list, pending(arg, rid))
            out.append([[r.replica_id.unique_id for r in rank] for rank in ranks])
        return replicas, out, router.counters

    return asyncio.run(main())


def wid(uid: str) -> str:
    return serve_worker_id(ReplicaID(uid, DEP))


def test_worker_ids_are_valid_for_the_service_and_distinct():
    ids = {wid(u) for u in ("a1", "b2", "c3")}
    assert len(ids) == 3
    for w in ids:
        assert check_worker_id(w) == w
    assert wid("a1") == "serve:my-app/LLM-Server/a1"


def test_the_index_ranking_becomes_serve_ranks_unknown_replicas_last():
    index = ScriptedIndex(answer(wid("b2"), "someone-else", wid("a1")))
    req = ServeRequest(token_ids=[1, 2, 3], salt="t1")
    _, decisions, counters = run(index, [(req, "r1"), (req, "r1")])
    assert decisions[0] == [["b2"], ["a1"], ["c3"]]
    # A retry of the same request asks again without side effects on the service.
    assert index.calls == [([1, 2, 3], "t1", False), ([1, 2, 3], "t1", True)]
    assert counters["index"] == 2


@pytest.mark.parametrize("error", [
    *(pytest.param(KvmeshError(r.code, "scripted"), id=r.code.name) for r in TABLE),
    pytest.param(TimeoutError(), id="timeout"),
])
def test_index_failures_fall_back_to_power_of_two_as_the_retry_table_says(error):
    index = ScriptedIndex(error)
    reqs = [({"token_ids": [5, 6]}, f"r{i}") for i in range(3)]
    _, decisions, counters = run(index, reqs, retry_after_s=30.0)
    for ranks in decisions:  # Ray's default: one rank of two distinct random replicas
        assert len(ranks) == 1 and len(set(ranks[0])) == 2
    if isinstance(error, KvmeshError) and not retried(Source.SERVICE, error.code):
        # the request's own fault: this request falls back, the index stays in use
        assert len(index.calls) == 3 and counters["fallback_refused"] == 3
        return
    assert len(index.calls) == 1  # every replica failed: skipped for retry_after_s
    assert counters["fallback_unreachable"] == 3


def test_degraded_or_useless_answers_and_token_less_requests_fall_back():
    _, _, counters = run(ScriptedIndex(answer(wid("a1"), degraded=True)),
                         [(ServeRequest(token_ids=[1]), "r1")])
    assert counters["fallback_degraded"] == 1
    _, _, counters = run(ScriptedIndex(answer("not-a-replica")),
                         [(ServeRequest(token_ids=[1]), "r1")])
    assert counters["fallback_unknown"] == 1
    index = ScriptedIndex(answer(wid("a1")))
    _, _, counters = run(index, [({"prompt": "text only"}, "r1")])
    assert counters["fallback_no_tokens"] == 1 and index.calls == []


def test_the_tenant_reaches_the_route_and_a_bad_one_falls_back_alone():
    """A request's tenant goes with its Route; a name the client refuses is that request's
    fault: it falls back to power-of-two choices, and the index stays in use."""
    index = ScriptedIndex(answer(wid("a1")))
    reqs = [(ServeRequest(token_ids=[1], tenant="acme"), "r1"),
            (ServeRequest(token_ids=[1], tenant="two words"), "r2"),
            (ServeRequest(token_ids=[1]), "r3")]
    _, decisions, counters = run(index, reqs)
    assert index.tenants == ["acme", "two words", None]
    assert decisions[0][0] == ["a1"] and decisions[2][0] == ["a1"]
    assert counters["fallback_refused"] == 1 and counters["index"] == 2


@pytest.mark.parametrize("arg,expected", [
    (ServeRequest(token_ids=[1, 2], salt="s"), ([1, 2], "s", None)),
    (ServeRequest(token_ids=[1, 2], tenant="acme"), ([1, 2], None, "acme")),
    ({"token_ids": (3,), "salt": "", "tenant": ""}, ([3], None, None)),
    ({"prompt": "x"}, None),
])
def test_request_prompt(arg, expected):
    async def main():
        return request_prompt(pending(arg))

    assert asyncio.run(main()) == expected
    assert request_prompt(None) is None


def test_tls_options_reach_the_index_client(certs):
    """The router reaches a TLS-only service (a real one, with a worker registered as a
    replica) through its ``tls_*`` options; without them it can only fall back. Refused
    settings (a certificate without a CA, an unreadable CA) fail at ``initialize_state``."""
    import grpc

    from kvmesh.rpc.tls import TlsFiles
    from kvmesh.v1 import index_pb2_grpc as pb_grpc
    from service.config import ServiceConfig
    from service.server import create_server
    from tests.service.protocol_worker import ProtocolWorker

    def router(**kw):
        r = KvmeshRequestRouter(deployment_id=DEP, handle_source=DeploymentHandleSource.UNKNOWN)
        r.initialize_state(index_timeout_s=5.0, **kw)
        r.update_replicas([FakeReplica(u) for u in ("a1", "b2")])
        return r

    async def main():
        cfg = ServiceConfig(tls_cert_file=str(certs.server_cert),
                            tls_key_file=str(certs.server_key))
        server, port = await create_server("127.0.0.1:0", cfg)
        await server.start()
        addr = [f"localhost:{port}"]
        try:
            creds = TlsFiles(ca=str(certs.ca)).channel_credentials()
            async with grpc.aio.secure_channel(addr[0], creds) as ch:
                w = ProtocolWorker(pb_grpc.IndexServiceStub(ch), wid("b2"))
                await w.join()
                await w.store(list(range(1, 33)))
            ranks = {}
            for name, kw in (("tls", {"tls_ca": str(certs.ca)}), ("plain", {})):
                r = router(service_addresses=addr, **kw)
                got = await r.choose_replicas(r._replicas_list,
                                              pending(ServeRequest(token_ids=list(range(1, 34)))))
                ranks[name] = ([[x.replica_id.unique_id for x in rank] for rank in got],
                               dict(r.counters))
            return ranks
        finally:
            await server.stop(None)

    ranks = asyncio.run(main())
    assert ranks["tls"] == ([["b2"], ["a1"]], {"index": 1})
    assert ranks["plain"][1] == {"fallback_unreachable": 1}
    with pytest.raises(ValueError, match="without --tls-ca"):
        router(service_addresses=["h:1"], tls_cert=str(certs.client_cert),
               tls_key=str(certs.client_key))
    with pytest.raises(ValueError, match="--tls-ca .*cannot read"):
        router(service_addresses=["h:1"], tls_ca="/nonexistent/ca.pem")


def test_each_ranked_replicas_fetch_plan_travels_in_the_request():
    """The plans of the candidates that are replicas go into the routed argument (a
    ServeRequest or a dict), keyed by worker id; each replica reads its own."""
    from client.results import FetchPlan
    from deploy.ray.request import fetch_plan_for
    from kvmesh.v1 import index_pb2

    plan = FetchPlan("someone-else", "h:9", 1, (b"\x07" * 32,), 16, 0.002, b"ticket")
    routed = answer(wid("b2"), "someone-else", wid("a1"))
    routed.candidates[0] = replace(routed.candidates[0], fetch=plan)
    routed.candidates[1] = replace(routed.candidates[1], fetch=plan)  # not a replica
    for req in (ServeRequest(token_ids=[1, 2, 3]), {"token_ids": [1, 2, 3]}):
        _, decisions, counters = run(ScriptedIndex(routed), [(req, "r1")])
        assert decisions[0][0] == ["b2"] and counters["fetch_plans"] == 1
        got = index_pb2.FetchPlan.FromString(fetch_plan_for(req, wid("b2")))
        assert (got.source_worker_id, got.start_block, list(got.block_hashes), got.ticket) \
            == ("someone-else", 1, [b"\x07" * 32], b"ticket")
        assert fetch_plan_for(req, wid("a1")) is None
        assert fetch_plan_for(req, "someone-else") is None
    plain = ServeRequest(token_ids=[1])
    _, _, counters = run(ScriptedIndex(answer(wid("a1"))), [(plain, "r1")])
    assert plain.fetch is None and counters["fetch_plans"] == 0
