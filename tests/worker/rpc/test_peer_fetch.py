"""A Generate carrying a fetch plan, over real gRPC and the real data plane: the prefix comes
from the peer ("peer" tokens) and the output is the recomputed one; every failure falls back
to recompute with the same output, counted by reason."""
from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest

from kvmesh.transfer.transports import TransferError
from kvmesh.transfer.transports import pull as real_pull
from kvmesh.v1 import worker_pb2
from tests.worker.rpc.peers import BS, generate, generate_request, peers, plan
from worker import Engine
from worker.engine.async_engine import AsyncEngine
from worker.model import load_model
from worker.rpc import peer_fetch
from worker.rpc.metrics import WorkerMetrics

_RNG = random.Random(3)
PROMPT = [_RNG.randrange(3, 256) for _ in range(6 * BS + 5)]


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


@pytest.fixture(scope="module")
def want(tiny):
    model, config = tiny
    e = Engine(model, config, block_size=BS, num_blocks=64)
    return e.generate([PROMPT], 6, ignore_eos=True)[0].token_ids


def engine(tiny, config=None, num_blocks: int = 64) -> Engine:
    model, cfg = tiny
    return Engine(model, config or cfg, block_size=BS, num_blocks=num_blocks)


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("transport", ["zmq", "grpc", "shm"])
def test_fetched_prefix_counts_as_peer_and_the_output_is_identical(tiny, want, transport):
    async def body():
        async with peers(("src", "cred-src", engine(tiny)),
                         ("dst", "cred-dst", engine(tiny))) as (src, dst):
            dst.servicer.peer_fetcher.transport = transport
            first = await generate(src, generate_request(PROMPT))
            got = await generate(dst, generate_request(PROMPT, fetch=plan(src, dst, PROMPT,
                                                                          0, 6)))
            stats = {p.worker_id: (await p.stub.Stats(worker_pb2.WorkerStatsRequest()))
                     for p in (src, dst)}
            metrics = {p.worker_id: WorkerMetrics(p.servicer.runner, p.worker_id,
                                                  peer=p.servicer.peer).registry
                       for p in (src, dst)}
            return first, got, stats, dst.engine.load(), metrics

    first, got, stats, load, metrics = run(body())
    assert list(first.token_ids) == want == list(got.token_ids)
    assert dict(got.cached_tokens_by_tier) == {"gpu": 0, "cpu": 0, "disk": 0, "peer": 6 * BS}
    assert got.num_cached_tokens == 6 * BS
    dst, src = stats["dst"].peer, stats["src"].peer
    assert (dst.fetches, dst.fetched_blocks, dst.fallbacks, dst.peer_hit_tokens) == (
        1, 6, 0, 6 * BS)
    assert dst.fetched_bytes == src.served_bytes > 0
    assert (src.served, src.served_blocks, src.refused) == (1, 6, 0)
    assert stats["dst"].load.peer_fetch and stats["dst"].load.fetch_us_per_block > 0
    assert load["fetch_us_per_call"] > 0
    recv, serve = ({"worker_id": "dst", "role": "receiver"}, {"worker_id": "src",
                                                             "role": "source"})
    assert metrics["dst"].get_sample_value("kvmesh_worker_peer_blocks_total", recv) == 6
    assert metrics["src"].get_sample_value("kvmesh_worker_peer_blocks_total", serve) == 6
    assert metrics["dst"].get_sample_value("kvmesh_worker_peer_hit_tokens_total",
                                           {"worker_id": "dst"}) == 6 * BS
    assert metrics["dst"].get_sample_value(
        "kvmesh_worker_peer_fetch_latency_seconds_count", recv) == 1


def test_a_data_plane_other_hosts_reach_is_encrypted_and_refuses_plaintext(tiny, want, caplog):
    """Sources listening on 0.0.0.0: the zmq fetch goes through CURVE with the same output;
    a receiver asking for the plaintext grpc plane is refused there and recomputes."""
    caplog.set_level("INFO", logger="worker.rpc.fetch_call")

    async def body():
        async with peers(("src", "cred-src", engine(tiny)), ("dst", "cred-dst", engine(tiny)),
                         ("dst2", "cred-dst2", engine(tiny)),
                         data_host="0.0.0.0") as (src, dst, dst2):
            await generate(src, generate_request(PROMPT))
            sealed = await generate(dst, generate_request(PROMPT, fetch=plan(src, dst, PROMPT,
                                                                             0, 6)))
            dst2.servicer.peer_fetcher.transport = "grpc"
            refused = await generate(dst2, generate_request(PROMPT, fetch=plan(
                src, dst2, PROMPT, 0, 6)))
            data = await src.servicer.peer_source.data_server()
            return (sealed, refused, data.encrypt, dict(src.servicer.peer.refusals),
                    dict(dst2.servicer.peer.fallbacks))

    sealed, refused, encrypted, refusals, fallbacks = run(body())
    assert encrypted and list(sealed.token_ids) == want == list(refused.token_ids)
    assert "peer KV data plane on 0.0.0.0: CURVE-encrypted (transports zmq, shm)" in caplog.text
    assert sealed.cached_tokens_by_tier["peer"] == 6 * BS
    assert refused.cached_tokens_by_tier["peer"] == 0 and refusals == {"plaintext": 1}
    assert sum(fallbacks.values()) == 1, fallbacks


def _fallback(tiny, want, *, mutate=None, receiver=None, source_on=True, kill=False):
    """Generate on dst with a plan for PROMPT from src, spoiled by ``mutate(plan)``: the
    response and dst's fallback counts by reason."""
    async def body():
        async with peers(("src", "cred-src", engine(tiny)),
                         ("dst", "cred-dst", receiver or engine(tiny)),
                         peer_fetch=(source_on, True)) as (src, dst):
            await generate(src, generate_request(PROMPT))
            p = plan(src, dst, PROMPT, 0, 6)
            if mutate is not None:
                mutate(p)
            if kill:
                await src.servicer.peer_source.close()
                p.source_address = "127.0.0.1:1"  # nobody listens there
            got = await generate(dst, generate_request(PROMPT, fetch=p))
            stats = await dst.stub.Stats(worker_pb2.WorkerStatsRequest())
            assert dict(stats.peer.fallbacks_by_reason) == dst.servicer.peer.fallbacks
            return got, dict(dst.servicer.peer.fallbacks)

    got, reasons = run(body())
    assert "peer" not in got.cached_tokens_by_tier and got.num_cached_tokens == 0
    if receiver is None:
        assert list(got.token_ids) == want
    return got, reasons


def test_source_unreachable_falls_back(tiny, want):
    assert _fallback(tiny, want, kill=True)[1] == {"unavailable": 1}


def test_fallbacks_and_refusals_are_labelled_by_reason_in_the_metrics():
    from worker.rpc.peer_stats import PeerCounters

    counters = PeerCounters()
    counters.fallback("timeout")
    counters.refuse("expired")
    counters.refuse("expired")
    runner = AsyncEngine(Engine.from_pretrained("tiny", num_blocks=8))
    registry = WorkerMetrics(runner, "w", peer=counters).registry
    assert registry.get_sample_value("kvmesh_worker_peer_fallbacks_total",
                                     {"worker_id": "w", "reason": "timeout"}) == 1
    assert registry.get_sample_value("kvmesh_worker_peer_refusals_total",
                                     {"worker_id": "w", "reason": "expired"}) == 2


def test_a_plan_whose_hashes_are_not_this_prompt_is_not_fetched(tiny, want):
    def other(p):
        p.block_hashes[1] = b"\x00" * len(p.block_hashes[1])

    assert _fallback(tiny, want, mutate=other)[1] == {"hashes": 1}


def test_a_source_with_the_switch_off_refuses_and_the_receiver_recomputes(tiny, want):
    assert _fallback(tiny, want, source_on=False)[1] == {"refused": 1}


def test_a_forged_ticket_is_refused_and_recomputed(tiny, want):
    def forge(p):
        p.ticket = p.ticket[:-1] + bytes([p.ticket[-1] ^ 1])

    assert _fallback(tiny, want, mutate=forge)[1] == {"refused": 1}


def test_another_model_config_is_refused_by_fingerprint_and_recomputed(tiny):
    model, config = tiny
    other = dataclasses.replace(config, rms_norm_eps=config.rms_norm_eps * 2)
    mine = Engine(model, other, block_size=BS, num_blocks=64)
    alone = Engine(model, other, block_size=BS, num_blocks=64).generate(
        [PROMPT], 6, ignore_eos=True)[0].token_ids
    got, reasons = _fallback(tiny, None, receiver=mine)
    assert reasons == {"fingerprint": 1}
    assert list(got.token_ids) == alone


def test_a_source_that_evicted_the_chain_in_between_serves_what_it_still_holds(tiny, want):
    async def body():
        async with peers(("src", "cred-src", engine(tiny, num_blocks=12)),
                         ("dst", "cred-dst", engine(tiny))) as (src, dst):
            await generate(src, generate_request(PROMPT))
            p = plan(src, dst, PROMPT, 0, 6)
            rng = random.Random(9)
            await generate(src, generate_request([rng.randrange(3, 256)
                                                  for _ in range(10 * BS)]))
            got = await generate(dst, generate_request(PROMPT, fetch=p))
            return got, dict(dst.servicer.peer.fallbacks)

    got, reasons = run(body())
    assert reasons == {"evicted": 1} and list(got.token_ids) == want
    assert got.cached_tokens_by_tier.get("peer", 0) == got.num_cached_tokens < 6 * BS


def test_a_transfer_stopping_half_way_keeps_the_whole_blocks_that_landed(tiny, want,
                                                                        monkeypatch):
    async def half(endpoint, block_bytes, count, sink, timeout_s):
        def first_two(i, block):
            if i >= 2:
                raise TransferError("closed", 2)
            sink(i, block)

        try:
            return await real_pull(endpoint, block_bytes, count, first_two, timeout_s)
        except TransferError as e:
            raise TransferError("closed", min(e.landed, 2)) from None

    monkeypatch.setattr(peer_fetch, "pull", half)

    async def body():
        async with peers(("src", "cred-src", engine(tiny)),
                         ("dst", "cred-dst", engine(tiny))) as (src, dst):
            await generate(src, generate_request(PROMPT))
            got = await generate(dst, generate_request(PROMPT, fetch=plan(src, dst, PROMPT,
                                                                          0, 6)))
            return got, dict(dst.servicer.peer.fallbacks)

    got, reasons = run(body())
    assert reasons == {"closed": 1}
    assert got.cached_tokens_by_tier["peer"] == 2 * BS and list(got.token_ids) == want


def test_the_receive_switch_off_ignores_plans(tiny, want):
    async def body():
        async with peers(("src", "cred-src", engine(tiny)),
                         ("dst", "cred-dst", engine(tiny)),
                         peer_fetch=(True, False)) as (src, dst):
            await generate(src, generate_request(PROMPT))
            got = await generate(dst, generate_request(PROMPT, fetch=plan(src, dst, PROMPT,
                                                                          0, 6)))
            return got, src.servicer.peer.served, dst.engine.load()["peer_fetch"]

    got, served, reported = run(body())
    assert served == 0 and not reported and list(got.token_ids) == want


def test_a_salted_prompt_is_fetched_under_its_salt_and_never_without_it(tiny, want):
    async def body():
        async with peers(("src", "cred-src", engine(tiny)),
                         ("dst", "cred-dst", engine(tiny))) as (src, dst):
            await generate(src, generate_request(PROMPT, salt="tenant-a"))
            salted = await generate(dst, generate_request(
                PROMPT, salt="tenant-a", fetch=plan(src, dst, PROMPT, 0, 6, salt="tenant-a")))
            # a plan for the unsalted chain does not name this (salted) prompt's blocks
            other = await generate(dst, generate_request(
                PROMPT, salt="tenant-b", fetch=plan(src, dst, PROMPT, 0, 6)))
            return salted, other, dict(dst.servicer.peer.fallbacks)

    salted, other, reasons = run(body())
    assert salted.cached_tokens_by_tier["peer"] == 6 * BS and list(salted.token_ids) == want
    assert other.num_cached_tokens == 0 and list(other.token_ids) == want
    assert reasons == {"hashes": 1}
