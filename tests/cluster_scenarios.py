"""What a kvmesh cluster must do whatever runs it: local processes (tests/integration) or
Ray actors (tests/integration/ray) run these same scenarios against their own cluster."""
from __future__ import annotations

import random
import time

import grpc

from client import KvmeshClient
from deploy.waiting import wait_until
from kvmesh.v1 import worker_pb2, worker_pb2_grpc

SYSTEM = [random.Random(0).randrange(256) for _ in range(200)]  # 12 full blocks + 8


def question(i: int) -> list[int]:
    """The shared system prompt followed by question ``i``."""
    return SYSTEM + [random.Random(100 + i).randrange(256) for _ in range(20)]


def holder_match(client, tokens: list[int], worker_id: str, salt: str | None = None) -> int:
    """Tokens the index says ``worker_id`` holds (a dry run: it records nothing)."""
    for c in client.route(tokens, salt=salt, dry_run=True).candidates:
        if c.worker_id == worker_id:
            return c.matched_tokens
    return 0


def holder_settled(client, tokens: list[int], worker_id: str, matched: int) -> bool:
    """The index says ``worker_id`` holds ``matched`` tokens of ``tokens`` and counts no work
    routed to it since its last heartbeat (a dry run: it records nothing)."""
    for c in client.route(tokens, dry_run=True).candidates:
        if c.worker_id == worker_id:
            return (c.matched_tokens >= matched and not c.load.get("waiting")
                    and not c.load.get("queued_prefill_tokens"))
    return False


def generate_on(address: str, tokens: list[int], max_tokens: int = 2):
    """Generate directly on one worker, bypassing routing; returns the final message."""
    with grpc.insecure_channel(address) as ch:
        stub = worker_pb2_grpc.WorkerServiceStub(ch)
        return list(stub.Generate(worker_pb2.GenerateRequest(
            token_ids=tokens, sampling=worker_pb2.SamplingParams(max_tokens=max_tokens,
                                                                 ignore_eos=True))))[-1]


def shared_prefix_goes_to_its_holder(client) -> None:
    first = client.generate(question(0), max_tokens=4)
    assert first.num_cached_tokens == 0
    holder = first.worker_id
    # Until the holder's next heartbeat the service counts the routed prompt as work queued
    # on it (so a burst spreads); once the heartbeat shows it idle, its cached prefix wins.
    wait_until(lambda: holder_settled(client, question(1), holder, 192), 10.0,
               what="the holder idle with the prefix")
    route = client.route(question(1))
    # >= : the route above may have left provisional entries for its own new blocks.
    assert route.worker_id == holder and route.matched_tokens >= 192
    second = client.generate(question(1), max_tokens=4)
    assert second.worker_id == holder and second.num_cached_tokens == 192


def another_salt_never_matches(client) -> None:
    route = client.route(question(2), salt="tenant-b")
    assert all(c.matched_tokens == 0 for c in route.candidates)
    assert client.generate(question(2), max_tokens=2, salt="tenant-b").num_cached_tokens == 0


def replicas_agree(client, addresses: list[str], ttl_s: float = 2.0) -> None:
    """Every service replica answers the same route: they share one index."""
    # The first route records provisional entries for the chosen worker's new blocks (shared
    # through Redis, so every replica sees them); compare the answers after it. Those entries
    # expire after the service's provisional TTL (``ttl_s``): a round a loaded host stretched
    # past it may see them on one replica only, so such a round is done again. So is one in
    # which the replicas saw different live workers: each re-reads the worker records every
    # refresh interval, and a heartbeat a loaded host delayed is a liveness question, not an
    # index one (the index is what must agree).
    for _ in range(5):
        t0 = time.monotonic()
        client.route(question(3))
        answers = []
        for address in addresses:
            with KvmeshClient(address) as c:
                r = c.route(question(3), dry_run=True)
                answers.append(sorted((x.worker_id, x.matched_tokens) for x in r.candidates))
        live = [{w for w, _ in a} for a in answers]
        if time.monotonic() - t0 < ttl_s / 2 and all(x == live[0] for x in live):
            break
        time.sleep(0.3)
    assert answers[0] == answers[1], answers
    assert max(m for _, m in answers[0]) >= 192, answers
