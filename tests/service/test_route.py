"""Route through the real service (memory backend, protocol workers): peer fetch plans with
their tickets, and ``RouteRequest.worker_id``, which restricts the answer to one worker.

Workers ``a`` (holds the prompt's prefix, busy) and ``b`` (idle, holds nothing) both serve
and receive peer blocks and report a cheap measured fetch, so with ``--peer-fetch`` the
cheapest option is "run on b after pulling a's blocks".
"""
from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from kvmesh.transfer import ticket
from kvmesh.v1 import index_pb2 as pb
from service.config import ServiceConfig
from service.worker_tokens import mint
from tests.service.manual_clock import ManualClock
from tests.service.protocol_worker import BS, ProtocolWorker, prompt, route, serve

ROUTER, SECRET = "router-token", "a-worker-secret-of-32-characters"
PROMPT = prompt(64)                  # 16 blocks of 4; 15 usable (the last token is computed)
USABLE = (len(PROMPT) - 1) // BS
CHEAP = dict(prefill_us_per_token=200.0, fetch_us_per_call=100.0, fetch_us_per_block=10.0,
             peer_fetch=True, total_blocks=1000, free_blocks=1000, free_empty_blocks=1000)
BUSY = {**CHEAP, "queued_prefill_tokens": 20_000}
ON = dict(peer_fetch=True, min_fetch_blocks=2, token=ROUTER, worker_secret=SECRET)


def key(worker_id: str) -> bytes:
    """The peer key of ``worker_id``: of the bound token it presents to the service."""
    return ticket.peer_key(mint(SECRET, worker_id))


async def cluster(stub: Any, a_load: dict, b_load: dict,
                  others: tuple[ProtocolWorker, ...] = ()) -> list[bytes]:
    """``a`` holding PROMPT, ``b`` holding nothing (and ``others``); returns a's chain."""
    a = ProtocolWorker(stub, "a", port=9001, token=mint(SECRET, "a"))
    b = ProtocolWorker(stub, "b", port=9002, token=mint(SECRET, "b"))
    await a.join(**a_load)
    await b.join(**b_load)
    for w in others:
        await w.join(**CHEAP)
    return await a.store(PROMPT)


def routed(stub: Any, clock: ManualClock | None = None, **kw: Any) -> Any:
    return route(stub, PROMPT, token=ROUTER, **kw)


def test_a_busy_holder_makes_the_idle_worker_fetch_with_a_ticket_only_it_can_use() -> None:
    clock = ManualClock()

    async def main() -> tuple[pb.RouteResponse, list[bytes], dict[str, float]]:
        async with serve(ServiceConfig(**ON), clock=clock) as r:
            chain = await cluster(r.stub, BUSY, CHEAP)
            resp = await routed(r.stub)
            return resp, chain, r.server.servicer.metrics.summary()

    resp, chain, counters = asyncio.run(main())
    best, other = resp.candidates
    assert (best.worker_id, other.worker_id) == ("b", "a")
    plan = best.fetch
    assert (plan.source_worker_id, plan.source_address, plan.start_block) == (
        "a", "127.0.0.1:9001", 0)
    assert list(plan.block_hashes) == chain[:USABLE]
    assert plan.tokens == USABLE * BS == best.matched_tokens
    assert plan.est_s == pytest.approx((100.0 + USABLE * 10.0) / 1e6)
    assert not other.HasField("fetch")  # the holder runs on what it holds
    hashes, t = list(plan.block_hashes), plan.ticket
    grant = ticket.verify(key("a"), t, ticket.proof(key("b"), t), source="a", requester="b",
                          block_hashes=hashes, now_ms=clock())
    assert grant.expiry_ms == clock() + 30_000  # --fetch-ticket-ttl-s, from the service clock
    # whoever holds only the ticket (the router, the client, another worker) cannot use it
    for stolen in (ticket.peer_key(ROUTER), key("c"), ticket.peer_key("")):
        with pytest.raises(ticket.TicketError) as e:
            ticket.verify(key("a"), t, ticket.proof(stolen, t), source="a", requester="b",
                          block_hashes=hashes, now_ms=clock())
        assert e.value.reason == "forged"
    with pytest.raises(ticket.TicketError) as e:
        ticket.verify(key("a"), t, ticket.proof(key("b"), t), source="a", requester="b",
                      block_hashes=hashes, now_ms=clock() + 30_001)
    assert e.value.reason == "expired"
    assert counters["route_fetch_plans_total"] == 1
    assert counters["route_fetch_blocks_total"] == USABLE


@pytest.mark.parametrize("case", ["service off", "receiver off", "source off", "too few"])
def test_no_plan_when_fetch_is_off_anywhere_or_too_small(case: str) -> None:
    cfg = {**ON, "peer_fetch": case != "service off",
           "min_fetch_blocks": USABLE + 1 if case == "too few" else 2}
    a_load = {**BUSY, "peer_fetch": case != "source off"}
    b_load = {**CHEAP, "peer_fetch": case != "receiver off"}

    async def main() -> pb.RouteResponse:
        async with serve(ServiceConfig(**cfg)) as r:
            await cluster(r.stub, a_load, b_load)
            return await routed(r.stub)

    resp = asyncio.run(main())
    assert resp.candidates[0].worker_id == "b"  # a is busy: b recomputes
    assert not any(c.HasField("fetch") for c in resp.candidates)
    assert resp.candidates[0].matched_tokens == 0


def test_dry_runs_plan_too_and_only_returned_candidates_get_plans() -> None:
    async def main() -> tuple[pb.RouteResponse, pb.RouteResponse, dict[str, float]]:
        async with serve(ServiceConfig(**ON)) as r:
            c = ProtocolWorker(r.stub, "c", port=9003, token=mint(SECRET, "c"))
            await cluster(r.stub, BUSY, CHEAP, others=(c,))
            dry = await routed(r.stub, dry_run=True)
            one = await routed(r.stub, dry_run=True, max_candidates=1)
            return dry, one, r.server.servicer.metrics.summary()

    dry, one, counters = asyncio.run(main())
    planned = [c.worker_id for c in dry.candidates if c.HasField("fetch")]
    assert sorted(planned) == ["b", "c"] and dry.candidates[-1].worker_id == "a"
    assert all(c.fetch.ticket for c in dry.candidates if c.HasField("fetch"))
    assert len(one.candidates) == 1 and one.candidates[0].HasField("fetch")
    assert counters["route_fetch_plans_total"] == 3  # 2 + 1: none for c beyond the cut


def test_worker_id_keeps_that_worker_and_may_still_fetch_to_it() -> None:
    """a idle holds the prefix (the natural best); naming b answers b alone, with a fetch
    from a; naming a answers a alone without one."""
    async def main() -> tuple[pb.RouteResponse, pb.RouteResponse, pb.RouteResponse]:
        async with serve(ServiceConfig(**ON)) as r:
            await cluster(r.stub, CHEAP, CHEAP)
            free = await routed(r.stub, dry_run=True)
            to_b = await routed(r.stub, worker_id="b")
            to_a = await routed(r.stub, worker_id="a", dry_run=True)
            return free, to_b, to_a

    free, to_b, to_a = asyncio.run(main())
    assert [c.worker_id for c in free.candidates][0] == "a"
    assert [c.worker_id for c in to_b.candidates] == ["b"]
    assert to_b.candidates[0].fetch.source_worker_id == "a"
    assert [c.worker_id for c in to_a.candidates] == ["a"]
    assert not to_a.candidates[0].HasField("fetch")
    assert to_a.candidates[0].matched_tokens == USABLE * BS


def test_worker_id_errors_name_the_fix() -> None:
    clock = ManualClock()

    async def main() -> dict[str, tuple[grpc.StatusCode, str]]:
        out = {}
        async with serve(ServiceConfig(**ON), clock=clock) as r:
            m2 = ProtocolWorker(r.stub, "m2", model="other", port=9009,
                                token=mint(SECRET, "m2"))
            await cluster(r.stub, CHEAP, CHEAP, others=(m2,))
            cases = {"unknown": dict(worker_id="ghost"),
                     "malformed": dict(worker_id="bad id!"),
                     "other model": dict(worker_id="m2", model="tiny")}
            for name, kw in cases.items():
                try:
                    await routed(r.stub, **kw)
                except grpc.aio.AioRpcError as e:
                    out[name] = (e.code(), e.details())
            # the model is the named worker's when the request names none (two are served)
            ok = await routed(r.stub, worker_id="m2", dry_run=True)
            out["resolved"] = (grpc.StatusCode.OK, ok.candidates[0].worker_id)
            clock.advance(60_000)  # every worker's heartbeat is now too old: b is dead
            try:
                await routed(r.stub, worker_id="b")
            except grpc.aio.AioRpcError as e:
                out["dead"] = (e.code(), e.details())
        return out

    out = asyncio.run(main())
    assert out["unknown"][0] == out["dead"][0] == grpc.StatusCode.NOT_FOUND
    assert "'ghost'" in out["unknown"][1] and "kvmesh stats" in out["unknown"][1]
    assert "'b'" in out["dead"][1]
    assert out["malformed"][0] == grpc.StatusCode.INVALID_ARGUMENT
    code, message = out["other model"]
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "'other'" in message
    assert out["resolved"] == (grpc.StatusCode.OK, "m2")
