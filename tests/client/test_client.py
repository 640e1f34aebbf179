"""The kvmesh client (sync and asyncio flavours) against scripted loopback gRPC servers."""
from __future__ import annotations

import asyncio

import grpc
import pytest

from client import AsyncKvmeshClient, GenerateResult, KvmeshClient, KvmeshError, RouteResult
from kvmesh.rpc.auth import worker_access_token
from kvmesh.rpc.channel import parse_addresses
from kvmesh.rpc.retry import ReplicaRing
from kvmesh.v1 import index_pb2
from tests.client.fake_servers import FakeIndex, FakeWorker, candidate, closed_port_address


def test_parse_addresses_and_ring_order() -> None:
    assert parse_addresses(" a:1, b:2 ,a:1,") == ["a:1", "b:2"]
    assert parse_addresses(["a:1,b:2", "c:3"]) == ["a:1", "b:2", "c:3"]
    with pytest.raises(ValueError):
        parse_addresses(" , ")
    ring = ReplicaRing(["a", "b", "c"])
    assert ring.order() == ["a", "b", "c"]
    ring.mark_good("b")
    assert ring.order() == ["b", "c", "a"]


def test_prompt_must_be_token_ids(make_client) -> None:
    client = make_client(closed_port_address())
    for bad in ("hello", b"hi", [1, 2.5]):
        with pytest.raises(TypeError):
            client.route(bad)


def test_route_converts_response_and_sends_request(cluster, make_client) -> None:
    index = FakeIndex([candidate("w1", "h1:1", matched=32, cost=5.5),
                       candidate("w2", "h2:2", cost=40.0, tier=index_pb2.TIER_CPU)])
    index.degraded = True
    client = make_client(cluster.index(index))
    result = client.route([1, 2, 3], salt="tenant-a", lora=("ad", "/p"), mm=[("img", 0, 2)],
                      policy="prefix_only", max_candidates=2)
    assert isinstance(result, RouteResult)
    assert (result.worker_id, result.address, result.matched_tokens) == ("w1", "h1:1", 32)
    assert result.degraded and result.prompt_tokens == 3 and result.policy == "kvmesh"
    assert [c.worker_id for c in result.candidates] == ["w1", "w2"]
    second = result.candidates[1]
    assert second.tier == "TIER_CPU" and second.cost == 40.0
    assert second.load["waiting"] == 2 and second.load["total_blocks"] == 16
    sent = index.routes[-1]
    assert list(sent.token_ids) == [1, 2, 3] and sent.salt == "tenant-a"
    assert (sent.lora.name, sent.lora.path) == ("ad", "/p")
    assert sent.mm[0].identifier == "img" and sent.mm[0].length == 2
    assert sent.policy == "prefix_only" and sent.max_candidates == 2


def test_router_token_to_the_service_access_token_to_workers(cluster, make_client) -> None:
    access = worker_access_token("s3cret", "w1")
    worker = FakeWorker("w1", token=access)
    worker_address = cluster.worker(worker)
    index = FakeIndex([candidate("w1", worker_address)], token="s3cret")
    client = make_client(cluster.index(index), token="s3cret")
    client.route([1])
    client.generate([1], max_tokens=2)
    client.stats()
    client.worker_stats(worker_address, "w1")
    assert all(md["authorization"] == "Bearer s3cret" for md in index.metadata)
    assert all(md["authorization"] == f"Bearer {access}" for md in worker.metadata)
    assert len(index.metadata) == 3 and len(worker.metadata) == 2


def test_wrong_token_raises_unauthenticated(cluster, make_client) -> None:
    client = make_client(cluster.index(FakeIndex(token="right")), token="wrong")
    with pytest.raises(KvmeshError) as info:
        client.route([1])
    assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert info.value.message == "missing or wrong bearer token"


def test_generate_returns_final_facts(cluster, make_client) -> None:
    worker = FakeWorker("w1", cached=16)
    client = make_client(cluster.index(FakeIndex([candidate("w1", cluster.worker(worker), 16)])))
    result = client.generate(list(range(20)), max_tokens=5, salt="s", temperature=0.5, seed=7)
    assert isinstance(result, GenerateResult)
    assert result.token_ids == [100, 101, 102, 103, 104]
    assert (result.worker_id, result.finish_reason) == ("w1", "length")
    assert (result.num_cached_tokens, result.prompt_tokens, result.ttft_s) == (16, 20, 0.0125)
    assert result.matched_tokens == 16 and result.attempts == 1
    sent = worker.requests[-1]
    assert list(sent.token_ids) == list(range(20)) and sent.salt == "s"
    assert sent.sampling.max_tokens == 5 and sent.sampling.seed == 7
    assert sent.sampling.temperature == pytest.approx(0.5) and sent.request_id


def test_tiers_in_route_and_generate_results(cluster, make_client) -> None:
    """Matched tokens per tier reach the RouteResult and, for each candidate tried, that
    worker's GenerateRequest (never the previous candidate's); the worker's cached tokens
    per tier reach the GenerateResult."""
    broken, good = FakeWorker("w1", mode="abort"), FakeWorker("w2", cached=8)
    good.cached_by_tier = {"gpu": 4, "cpu": 4, "disk": 0}
    index = FakeIndex([
        candidate("w1", cluster.worker(broken), 12, tier=index_pb2.TIER_DISK,
                  by_tier={"gpu": 4, "cpu": 4, "disk": 4}),
        candidate("w2", cluster.worker(good), 8, tier=index_pb2.TIER_CPU,
                  by_tier={"gpu": 4, "cpu": 4})])
    client = make_client(cluster.index(index))
    routed = client.route([1] * 20)
    assert routed.matched_tokens_by_tier == {"gpu": 4, "cpu": 4, "disk": 4}
    assert routed.candidates[1].matched_tokens_by_tier == {"gpu": 4, "cpu": 4}
    result = client.generate([1] * 20, max_tokens=2)
    assert result.worker_id == "w2" and result.attempts == 2
    assert result.cached_tokens_by_tier == {"gpu": 4, "cpu": 4, "disk": 0}
    sent_first, sent_second = broken.requests[-1], good.requests[-1]
    assert dict(sent_first.index_matched_tokens_by_tier) == {"gpu": 4, "cpu": 4, "disk": 4}
    assert dict(sent_second.index_matched_tokens_by_tier) == {"gpu": 4, "cpu": 4}
    assert sent_second.index_matched_tokens == 8


def test_pin_and_unpin_send_the_prefix_with_the_admin_token(cluster, make_client) -> None:
    index = FakeIndex([candidate("w1", "h1:1")])
    index.pinned = [index_pb2.PinnedWorker(worker_id="w1", pinned_blocks=3),
                    index_pb2.PinnedWorker(worker_id="w2", error="UNAVAILABLE: gone")]
    client = make_client(cluster.index(index), token="router", admin_token="admin")
    result = client.pin(list(range(13)), "tenant", ttl_s=30.0, max_workers=2,
                        lora=("ad", "/p"), mm=[("img", 0, 2)], model="tiny")
    assert result.chain_blocks == 3
    assert [(w.worker_id, w.pinned_blocks, w.error) for w in result.workers] == [
        ("w1", 3, ""), ("w2", 0, "UNAVAILABLE: gone")]
    assert [w.worker_id for w in result.failed] == ["w2"]
    sent = index.pins[-1]
    assert isinstance(sent, index_pb2.PinPrefixRequest)
    assert (sent.ttl_s, sent.max_workers) == (30.0, 2)
    p = sent.prefix
    assert (list(p.token_ids), p.salt, p.model) == (list(range(13)), "tenant", "tiny")
    assert (p.lora.name, p.mm[0].identifier) == ("ad", "img") and not p.block_hashes
    client.unpin(None, block_hashes=[b"\x01" * 32])
    assert isinstance(index.pins[-1], index_pb2.UnpinPrefixRequest)
    assert list(index.pins[-1].prefix.block_hashes) == [b"\x01" * 32]
    assert [md["authorization"] for md in index.metadata] == ["Bearer admin"] * 2
    client.route([1])  # the router token everywhere else
    assert index.metadata[-1]["authorization"] == "Bearer router"
    for bad in (dict(token_ids=None), dict(token_ids=[1], block_hashes=[b"\x01" * 32])):
        with pytest.raises(ValueError, match="one of them"):
            client.pin(**bad)


def test_pin_without_the_admin_token_is_unauthenticated(cluster, make_client) -> None:
    client = make_client(cluster.index(FakeIndex(token="admin")), token="router")
    with pytest.raises(KvmeshError) as info:
        client.pin([1, 2, 3])
    assert info.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_generate_fails_over_from_a_closed_port(cluster, make_client) -> None:
    good = FakeWorker("w2")
    index = FakeIndex([candidate("w1", closed_port_address()),
                       candidate("w2", cluster.worker(good))])
    result = make_client(cluster.index(index)).generate([1, 2], max_tokens=3)
    assert result.worker_id == "w2" and result.attempts == 2
    assert result.token_ids == [100, 101, 102]


@pytest.mark.parametrize("mode", ["abort", "truncate"])
def test_generate_restarts_a_broken_stream_on_the_next_candidate(cluster, make_client,
                                                                 mode) -> None:
    broken, good = FakeWorker("w1", mode=mode), FakeWorker("w2")
    index = FakeIndex([candidate("w1", cluster.worker(broken)),
                       candidate("w2", cluster.worker(good))])
    result = make_client(cluster.index(index)).generate([1, 2], max_tokens=4)
    # The tokens of the broken attempt are dropped: only the whole second run is returned.
    assert result.worker_id == "w2" and result.token_ids == [100, 101, 102, 103]
    assert len(broken.requests) == 1 and len(good.requests) == 1
    assert broken.requests[0].request_id == good.requests[0].request_id


def test_the_tenant_reaches_the_route_and_every_worker_tried(cluster, make_client) -> None:
    """``tenant`` goes out in the RouteRequest and in the GenerateRequest of each worker the
    request fails over to; none is the default tenant (empty on the wire)."""
    broken, good = FakeWorker("w1", mode="abort"), FakeWorker("w2")
    index = FakeIndex([candidate("w1", cluster.worker(broken)),
                       candidate("w2", cluster.worker(good))])
    client = make_client(cluster.index(index))
    assert client.generate([1, 2], max_tokens=2, tenant="acme").worker_id == "w2"
    assert index.routes[-1].tenant == "acme"
    assert [r.tenant for r in broken.requests + good.requests] == ["acme", "acme"]
    client.route([1, 2], tenant="globex")
    assert index.routes[-1].tenant == "globex"
    client.generate([1, 2], max_tokens=2)
    assert index.routes[-1].tenant == "" and good.requests[-1].tenant == ""


@pytest.mark.parametrize("bad", ["two words", "tab\t", "*", "(other)", "x" * 65])
def test_a_bad_tenant_is_a_value_error_before_any_call(cluster, make_client, bad) -> None:
    index = FakeIndex([candidate("w1", closed_port_address())])
    client = make_client(cluster.index(index))
    for call in (client.route, client.generate):
        with pytest.raises(ValueError, match="tenant"):
            call([1, 2], tenant=bad)
    assert index.routes == []


def test_a_bad_tenant_fails_the_stream_call_itself() -> None:
    """Not at the first ``next``: a stream's caller learns it where it passed the name."""
    for kind in (KvmeshClient, AsyncKvmeshClient):
        with pytest.raises(ValueError, match="reserved"):
            kind(closed_port_address()).generate_stream([1], tenant="*")


@pytest.mark.slow
def test_generate_fails_over_on_deadline(cluster, make_client) -> None:
    slow, good = FakeWorker("w1", mode="hang"), FakeWorker("w2")
    index = FakeIndex([candidate("w1", cluster.worker(slow)),
                       candidate("w2", cluster.worker(good))])
    # The deadline is per attempt: long enough for the good worker's first call on a loaded
    # host (a new connection), short enough that the hung one costs little.
    client = make_client(cluster.index(index), generate_timeout=1.5)
    assert client.generate([1], max_tokens=2).worker_id == "w2"
    assert len(good.requests) == 1


def test_generate_raises_when_every_candidate_fails(cluster, make_client) -> None:
    down = closed_port_address()
    broken = FakeWorker("w2", mode="abort")
    index = FakeIndex([candidate("w1", down), candidate("w2", cluster.worker(broken))])
    with pytest.raises(KvmeshError) as info:
        make_client(cluster.index(index)).generate([1])
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert down in info.value.message and "worker shutting down" in info.value.message


def test_non_retryable_worker_error_is_raised_without_failover(cluster, make_client) -> None:
    bad, good = FakeWorker("w1", mode="invalid"), FakeWorker("w2")
    index = FakeIndex([candidate("w1", cluster.worker(bad)),
                       candidate("w2", cluster.worker(good))])
    with pytest.raises(KvmeshError) as info:
        make_client(cluster.index(index)).generate([1])
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.message == "prompt longer than the model"
    assert good.requests == []


def test_no_candidates_is_unavailable(cluster, make_client) -> None:
    client = make_client(cluster.index(FakeIndex([])))
    for call in (client.route, client.generate):
        with pytest.raises(KvmeshError) as info:
            call([1])
        assert info.value.code == grpc.StatusCode.UNAVAILABLE


def test_service_replica_failover_remembers_the_good_one(cluster, make_client) -> None:
    sick = FakeIndex()
    sick.error = (grpc.StatusCode.UNAVAILABLE, "replica draining")
    good = FakeIndex([candidate("w1", "h:1")])
    addresses = [closed_port_address(), cluster.index(sick), cluster.index(good)]
    client = make_client(",".join(addresses))
    assert client.route([1]).worker_id == "w1"
    assert client.route([2]).worker_id == "w1"
    assert client.stats()["service"] == addresses[2]
    assert len(sick.metadata) == 1 and len(good.metadata) == 3


def test_all_replicas_down_raises_unavailable(make_client) -> None:
    client = make_client([closed_port_address(), closed_port_address()])
    with pytest.raises(KvmeshError) as info:
        client.stats()
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert "all 2 service replica(s) failed" in info.value.message


def test_non_retryable_service_error_keeps_code_and_message(cluster, make_client) -> None:
    first, second = FakeIndex(), FakeIndex([candidate("w1", "h:1")])
    first.error = (grpc.StatusCode.INVALID_ARGUMENT, "salt longer than 4096 bytes")
    client = make_client([cluster.index(first), cluster.index(second)])
    with pytest.raises(KvmeshError) as info:
        client.route([1], salt="x")
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.message == "salt longer than 4096 bytes"
    assert str(info.value) == "INVALID_ARGUMENT: salt longer than 4096 bytes"
    assert second.metadata == []


def test_stats_and_worker_stats(cluster, make_client) -> None:
    worker_address = cluster.worker(FakeWorker("w1"))
    index = FakeIndex()
    index.stats = index_pb2.StatsResponse(
        workers=[index_pb2.WorkerInfo(
            worker_id="w1", address=worker_address, model="tiny", alive=True,
            load=index_pb2.WorkerLoad(running=2, waiting=1, queued_prefill_tokens=300,
                                      free_blocks=5, total_blocks=64),
            indexed_blocks=12, last_seq=9, heartbeat_age_s=0.4)],
        counters={"routes": 10.0, "route_hits": 4.0})
    client = make_client(cluster.index(index))
    stats = client.stats()
    (w,) = stats["workers"]
    assert (w["worker_id"], w["address"], w["alive"]) == ("w1", worker_address, True)
    assert (w["running"], w["waiting"], w["queued_prefill_tokens"]) == (2, 1, 300)
    assert (w["free_blocks"], w["total_blocks"], w["indexed_blocks"]) == (5, 64, 12)
    assert stats["counters"] == {"routes": 10.0, "route_hits": 4.0} and not stats["degraded"]
    ws = client.worker_stats(worker_address)
    assert ws["worker_id"] == "w1" and ws["cache"]["hit_rate"] == 0.75
    assert ws["load"]["total_blocks"] == 128 and ws["index_served_tokens"] == 48
    with pytest.raises(KvmeshError) as info:
        client.worker_stats(closed_port_address())
    assert info.value.code == grpc.StatusCode.UNAVAILABLE


def test_closed_client_refuses_calls(cluster, make_client) -> None:
    client = make_client(cluster.index(FakeIndex([candidate("w1", "h:1")])))
    client.route([1])
    client.close()
    client.close()
    with pytest.raises(RuntimeError):
        client.route([1])


def test_async_client_serves_concurrent_generates_with_failover(cluster) -> None:
    workers = [FakeWorker("w1", mode="abort"), FakeWorker("w2")]
    index = FakeIndex([candidate(w.worker_id, cluster.worker(w)) for w in workers])
    address = cluster.index(index)

    async def main() -> list[GenerateResult]:
        async with AsyncKvmeshClient([closed_port_address(), address]) as client:
            return await asyncio.gather(*(client.generate([i], max_tokens=3) for i in range(8)))

    results = asyncio.run(main())
    assert {r.worker_id for r in results} == {"w2"}
    assert all(r.token_ids == [100, 101, 102] and r.attempts == 2 for r in results)
    assert len(workers[1].requests) == 8
