"""Weighted fair admission (client/gateway/fair_slots.py): on one event loop, the order
slots are handed out in, what giving up leaves behind and the per-tenant cap; through a live
gateway, two tenants taking turns and a disconnected waiter leaving the queue."""
from __future__ import annotations

import asyncio
import socket
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from client.gateway.app import GatewayConfig
from client.gateway.fair_slots import FairSlots, parse_weights
from client.gateway.slots import Lease, TenantSlots, slot_owner
from client.gateway.tenants import Tenancy
from deploy.waiting import wait_until
from kvmesh.openai.errors import OpenAIError
from kvmesh.v1 import worker_pb2_grpc
from tests.client.fake_servers import FakeWorker, candidate, start_server
from tests.client.gateway.conftest import (
    METRICS_KEY,
    SECRET,
    TENANT_KEYS,
    LiveGateway,
    Stack,
    metric_samples,
)


class Harness:
    """Requests arriving at ``slots``; each admitted one holds its lease until finished."""

    def __init__(self, total: int = 1, cap: int = 1000, **kwargs: object) -> None:
        self.slots = FairSlots(total, TenantSlots(cap), **kwargs)
        self.order: list[str] = []
        self.leases: list[Lease] = []

    def arrive(self, share: str, count: int = 1, **kwargs: object) -> asyncio.Task[None]:
        async def go() -> None:
            lease = await self.slots.take(slot_owner(share, None), share, count, **kwargs)
            self.order.append(share)
            self.leases.append(lease)

        return asyncio.create_task(go())

    async def settle(self) -> None:
        for _ in range(4):
            await asyncio.sleep(0)

    async def finish_oldest(self) -> None:
        self.leases.pop(0).release()
        await self.settle()


def run(main):
    return asyncio.run(main())


def test_fifo_within_a_tenant() -> None:
    async def main():
        h = Harness(total=1)
        h.arrive("holder")
        await h.settle()
        tasks = []
        for _ in range(5):
            tasks.append(h.arrive("a"))
            await h.settle()
        # tag each waiter's admission by its arrival index
        arrivals = {t: i for i, t in enumerate(tasks)}
        admitted = []
        for _ in range(5):
            await h.finish_oldest()
            admitted += [arrivals[t] for t in tasks if t.done() and arrivals[t] not in admitted]
        return admitted, h.order

    admitted, order = run(main)
    assert admitted == [0, 1, 2, 3, 4] and order == ["holder"] + ["a"] * 5


def test_a_tenant_behind_a_long_backlog_is_served_within_one_round() -> None:
    async def main():
        h = Harness(total=4)
        for _ in range(104):  # 4 run, 100 wait
            h.arrive("a")
        await h.settle()
        assert h.slots.waiting("a") == 100
        await h.finish_oldest()
        await h.finish_oldest()  # some of a's backlog is admitted: a is ahead of V
        h.arrive("b")
        await h.settle()
        await h.finish_oldest()
        return h.order

    order = run(main)
    assert order == ["a"] * 6 + ["b"]  # 100 of a's still wait; b came next


def test_weights_2_to_1_give_exactly_2_to_1_admissions_while_both_wait() -> None:
    async def main():
        h = Harness(total=1, weights=parse_weights("a=2,b=1"))
        h.arrive("holder")
        await h.settle()
        for share in ("a", "b"):
            for _ in range(60):
                h.arrive(share)
        await h.settle()
        for _ in range(31):
            await h.finish_oldest()
        return h.order[1:]

    order = run(main)
    assert len(order) == 31
    assert Counter(order[:30]) == {"a": 20, "b": 10}
    for k in range(0, 30, 3):  # every round of three: two of a, one of b
        assert Counter(order[k:k + 3]) == {"a": 2, "b": 1}, order


def test_unweighted_tenants_alternate_and_a_greedy_one_is_not_rewarded() -> None:
    """a filled every free slot at once (nobody waited): it is tagged for that, so when both
    wait, b goes first."""
    async def main():
        h = Harness(total=3)
        for _ in range(3):
            h.arrive("a")
        await h.settle()
        for _ in range(3):
            h.arrive("a")
        for _ in range(3):
            h.arrive("b")
        await h.settle()
        for _ in range(6):
            await h.finish_oldest()
        return h.order[3:]

    assert run(main) == ["b", "a", "b", "a", "b", "a"]


def test_a_cancelled_waiter_leaves_the_queue_and_holds_nothing() -> None:
    async def main():
        h = Harness(total=1, cap=5)
        h.arrive("holder")
        await h.settle()
        gone = h.arrive("a")
        h.arrive("b")
        await h.settle()
        assert h.slots.waiting() == 2 and h.slots.caps.in_use(slot_owner("a", None)) == 1
        gone.cancel()
        await h.settle()
        assert h.slots.waiting("a") == 0 and h.slots.caps.in_use(slot_owner("a", None)) == 0
        await h.finish_oldest()
        assert h.order == ["holder", "b"] and h.slots.admitted == 1
        await h.finish_oldest()
        assert h.slots.admitted == 0 and h.slots.waiting() == 0

    run(main)


def test_a_waiter_cancelled_just_as_it_was_admitted_hands_its_slot_on() -> None:
    async def main():
        h = Harness(total=1)
        h.arrive("holder")
        await h.settle()
        late = h.arrive("a")
        h.arrive("b")
        await h.settle()
        h.leases.pop(0).release()  # a is admitted (its future resolved) ...
        late.cancel()               # ... and cancelled before it ran again
        await h.settle()
        assert late.cancelled() and h.order == ["holder", "b"] and h.slots.admitted == 1
        assert h.slots.caps.in_use(slot_owner("a", None)) == 0

    run(main)


def test_giving_up_on_the_deadline_or_a_gone_client_is_503_and_leaks_nothing() -> None:
    async def main():
        h = Harness(total=1, max_wait_s=0.02)
        h.arrive("holder")
        await h.settle()
        with pytest.raises(OpenAIError) as late:
            await h.slots.take("o", "a")
        assert late.value.status == 503 and late.value.code == "overloaded"
        assert "--max-concurrent 1" in late.value.message and late.value.headers
        h.slots.max_wait_s = 10.0
        with pytest.raises(OpenAIError) as gone:
            await h.slots.take("o", "a", gone=lambda: asyncio.sleep(0))
        assert gone.value.code == "client_gone"
        assert h.slots.waiting() == 0 and h.slots.caps.in_use("o") == 0
        assert h.slots.admitted == 1

    run(main)


def test_the_per_tenant_cap_counts_waiting_prompts_and_refuses_at_once() -> None:
    async def main():
        h = Harness(total=2, cap=2)
        for _ in range(4):
            h.arrive("a")
        await h.settle()
        assert h.order == ["a", "a"] and h.slots.waiting("a") == 0  # 2 over the cap: refused
        h.arrive("b")
        h.arrive("b")
        await h.settle()
        with pytest.raises(OpenAIError) as over:
            await h.slots.take(slot_owner("b", None), "b")
        assert over.value.status == 429 and h.slots.waiting("b") == 2

    run(main)


def test_a_batch_waits_for_all_its_slots_and_those_behind_it_wait_their_turn() -> None:
    async def main():
        h = Harness(total=2)
        h.arrive("a")
        h.arrive("a")
        await h.settle()
        h.arrive("b", count=2)
        h.arrive("c")
        await h.settle()
        await h.finish_oldest()
        assert h.order == ["a", "a"]  # one free slot: b's batch of 2 is next and waits
        await h.finish_oldest()
        assert h.order[-1] == "b" and h.slots.admitted == 2

    run(main)


def test_no_bound_never_waits() -> None:
    async def main():
        h = Harness(total=0)
        for _ in range(50):
            h.arrive("a")
        await h.settle()
        return h.slots.admitted, h.slots.waiting()

    assert run(main) == (50, 0)


def test_weights_parse_with_clear_errors() -> None:
    assert parse_weights("a=2,b=1") == {"a": 2.0, "b": 1.0}
    assert parse_weights(["a=0.5", " b = 3 ,"]) == {"a": 0.5, "b": 3.0}
    assert parse_weights(None) == {} and parse_weights(["a=1", "c=4"]) == {"a": 1, "c": 4}
    for bad, words in (("a", "TENANT=WEIGHT"), ("a=0", "> 0"), ("a=-1", "> 0"),
                       ("a=x", "TENANT=WEIGHT"), ("a=inf", "> 0"), ("=2", "TENANT=WEIGHT"),
                       ("a b=2", "spaces"), ("*=2", "reserved"), ("a=1,a=2", "twice")):
        with pytest.raises(ValueError, match="--tenant-weights") as err:
            parse_weights(bad)
        assert words in str(err.value), bad
    with pytest.raises(ValueError, match="--max-concurrent"):
        FairSlots(-1, TenantSlots())


def test_through_the_gateway_two_tenants_take_turns_and_a_gone_client_leaves_the_queue(
        stack: Stack) -> None:
    """One slot, a worker that answers only when the test lets it: acme holds the slot with
    4 more waiting, then globex queues 2 and a client that hangs up. Each next slot goes to
    the tenants in turn (first come first served would run acme's 4 first); the hung-up
    client leaves the queue without ever reaching the worker."""
    worker = FakeWorker("paced")
    worker.permits = threading.Semaphore(0)
    server, address = start_server(worker, worker_pb2_grpc.add_WorkerServiceServicer_to_server)
    stack.index.candidates = [candidate("paced", address)]
    gw = LiveGateway(GatewayConfig(service=stack.index_address, generate_timeout=10,
                                   tenancy=Tenancy(TENANT_KEYS, SECRET), max_total=1,
                                   max_batch_prompts=1, max_wait_s=20,
                                   metrics_key=METRICS_KEY))
    fair = gw.server.config.app.state.gateway.fair

    def ask(key: str) -> str:
        done = gw.openai(key).completions.create(model="tiny", prompt="x", max_tokens=1)
        return done.choices[0].text

    try:
        with ThreadPoolExecutor(8) as pool:
            calls = [pool.submit(ask, "key-acme")]
            wait_until(lambda: len(worker.requests) == 1, 10, what="acme's first request")
            calls += [pool.submit(ask, "key-acme") for _ in range(4)]
            wait_until(lambda: fair.waiting("acme") == 4, 10, what="acme's backlog")
            calls += [pool.submit(ask, "key-globex") for _ in range(2)]
            wait_until(lambda: fair.waiting("globex") == 2, 10, what="globex waiting")
            samples = metric_samples(gw.url)
            assert samples["kvmesh_gateway_waiting_requests", ()] == 6
            assert samples["kvmesh_gateway_admitted_prompts", ()] == 1
            body = b'{"model": "tiny", "prompt": "x", "max_tokens": 1}'
            with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as gone:
                gone.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                             b"authorization: Bearer key-globex\r\n"
                             b"content-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(body), body))
                wait_until(lambda: fair.waiting("globex") == 3, 10, what="the third waiter")
            wait_until(lambda: fair.waiting("globex") == 2, 10, what="the hung-up waiter gone")
            worker.permits.release(7)
            assert [c.result(timeout=20) for c in calls] == ["d"] * 7
        assert [r.tenant for r in worker.requests] == [
            "acme", "globex", "acme", "globex", "acme", "acme", "acme"]
        assert fair.admitted == 0 and fair.waiting() == 0
    finally:
        worker.permits.release(20)
        gw.stop()
        server.stop(0)
