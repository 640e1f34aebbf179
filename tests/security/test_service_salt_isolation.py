"""Property: Route for one tenant (salt) never reports tokens matched from another tenant's
entries, whether held (published events) or provisional (recorded by earlier routes); the
same prompt under its own salt does match, so the isolation is not vacuous.

One service per backend (memory and the real Redis Lua path); hypothesis draws tenants and
prompts; every example uses prompts of its own (a unique first token), so the index fills
up with many tenants' entries as the examples go.
"""
from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kvmesh.v1 import index_pb2 as pb
from service.config import ServiceConfig
from tests.service.protocol_worker import BS, ProtocolWorker, route, serve

SALTS = st.one_of(st.none(), st.sampled_from(["acme", "globex", "a", "b"]),
                  st.text(min_size=1, max_size=6))
TAILS = st.lists(st.integers(0, 3), min_size=BS, max_size=5 * BS)


def matched(res: pb.RouteResponse) -> dict[str, int]:
    return {c.worker_id: c.matched_tokens for c in res.candidates}


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_route_never_matches_another_tenants_entries(backend: str, redis_url: str) -> None:
    cfg = ServiceConfig(backend=backend, redis_url=redis_url if backend == "redis" else None,
                        liveness_timeout_s=600, purge_after_s=600)
    loop = asyncio.new_event_loop()
    service = serve(cfg)
    r = loop.run_until_complete(service.__aenter__())
    workers = [ProtocolWorker(r.stub, f"w{i}", port=9000 + i) for i in range(2)]
    for w in workers:
        loop.run_until_complete(w.join())
    unique = itertools.count(1000)

    async def check(mine: str | None, other: str | None, tails: list[list[int]],
                    fresh: list[int]) -> None:
        first = next(unique)  # nobody ever stored a prompt starting with this token
        prompts = [[first, *t] for t in tails]
        for i, p in enumerate(prompts):  # held by both workers, under MY salt only
            await workers[i % 2].store(p, salt=mine)
        for p in prompts:
            theirs = await route(r.stub, p, salt=other, dry_run=True)
            assert set(matched(theirs).values()) == {0}, (mine, other, p)
            ours = matched(await route(r.stub, p, salt=mine, dry_run=True))
            assert max(ours.values()) == (len(p) - 1) // BS * BS  # isolation is not vacuous
        # provisional entries: I route a new prompt for real; the other tenant sees nothing
        new = [first, *fresh]
        await route(r.stub, new, salt=mine)
        assert set(matched(await route(r.stub, new, salt=other, dry_run=True)).values()) == {0}

    @settings(max_examples=30, deadline=None)
    @given(mine=SALTS, other=SALTS, tails=st.lists(TAILS, min_size=1, max_size=3),
           fresh=TAILS)
    def prop(mine: str | None, other: str | None, tails: list[list[int]],
             fresh: list[int]) -> None:
        assume(mine != other)
        loop.run_until_complete(check(mine, other, tails, fresh))

    try:
        prop()
    finally:
        loop.run_until_complete(service.__aexit__(None, None, None))
        loop.close()
