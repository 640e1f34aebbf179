"""Every row of ``kvmesh.rpc.retry.TABLE`` against scripted servers, for the sync client, the
async client and the async stream; and the rules above the table (a finished request is
never rerun, a stream never fails over after its first token, all attempts are named).

Adding a row to the table adds its tests here; ``docs/reliability.md`` must show the same.
"""
from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from client import AsyncKvmeshClient, GenerateResult, KvmeshError
from kvmesh.rpc.retry import TABLE, Action, Source, decide
from tests.client.fake_servers import (
    AFTER_FINAL,
    FakeIndex,
    FakeWorker,
    candidate,
    closed_port_address,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"
SERVICE_ROWS = [pytest.param(r.code, r.service, id=r.code.name) for r in TABLE]
WORKER_ROWS = [pytest.param(r.code, r.worker, id=r.code.name) for r in TABLE]
RETRIED_BY_WORKERS = [pytest.param(r.code, id=r.code.name) for r in TABLE
                      if r.worker is Action.NEXT_CANDIDATE]


def generate_with(flavour: str, address: str, **kwargs: Any) -> tuple[GenerateResult, int]:
    """Generate ``[1, 2, 3]`` through ``flavour`` (sync / async / stream); returns the result
    and how many token chunks a stream yielded before it (0 otherwise). A ``KvmeshError``
    from a stream carries the chunks yielded before it as ``chunks``."""
    if flavour == "sync":
        from client import KvmeshClient

        with KvmeshClient(address, generate_timeout=5) as client:
            return client.generate([1, 2, 3], **kwargs), 0

    async def run() -> tuple[GenerateResult, int]:
        async with AsyncKvmeshClient(address, generate_timeout=5) as client:
            if flavour == "async":
                return await client.generate([1, 2, 3], **kwargs), 0
            chunks = 0
            try:
                async for item in client.generate_stream([1, 2, 3], **kwargs):
                    if isinstance(item, GenerateResult):
                        return item, chunks
                    chunks += 1
            except KvmeshError as err:
                err.chunks = chunks  # type: ignore[attr-defined]
                raise
            raise AssertionError("stream ended without a result")

    return asyncio.run(run())


@pytest.fixture(params=["sync", "async", "stream"])
def generate(request: pytest.FixtureRequest) -> Callable[..., tuple[GenerateResult, int]]:
    return lambda address, **kw: generate_with(request.param, address, **kw)


@pytest.fixture
def flavour(generate: Any, request: pytest.FixtureRequest) -> str:
    return request.node.callspec.params["generate"]


def two_workers(cluster, first: FakeWorker) -> tuple[str, FakeWorker]:
    second = FakeWorker("w2")
    index = FakeIndex([candidate("w1", cluster.worker(first)),
                       candidate("w2", cluster.worker(second))])
    return cluster.index(index), second


def test_the_table_covers_every_code_once_and_the_doc_shows_it() -> None:
    codes = [r.code for r in TABLE]
    assert sorted(c.name for c in codes) == sorted(
        c.name for c in grpc.StatusCode if c is not grpc.StatusCode.OK)
    assert all(r.service in (Action.NEXT_REPLICA, Action.SURFACE) for r in TABLE)
    assert all(r.worker in (Action.NEXT_CANDIDATE, Action.SURFACE) for r in TABLE)
    row = re.compile(r"^\| `([A-Z_]+)` \| ([a-z ]+) \| ([a-z ]+) \|", re.M)
    documented = {m[1]: (m[2].strip(), m[3].strip()) for m in row.finditer(DOC.read_text())}
    assert documented == {r.code.name: (r.service.value, r.worker.value) for r in TABLE}


def test_delivered_tokens_and_unknown_codes_are_surfaced() -> None:
    for rule in TABLE:
        assert decide(Source.WORKER, rule.code, delivered=True) is Action.SURFACE
    assert decide(Source.WORKER, grpc.StatusCode.OK) is Action.SURFACE
    assert decide(Source.SERVICE, None) is Action.SURFACE


@pytest.mark.parametrize(("code", "action"), SERVICE_ROWS)
def test_service_replica_row(cluster, make_client, code, action) -> None:
    sick, good = FakeIndex([candidate("w1", "h:1")]), FakeIndex([candidate("w2", "h:2")])
    sick.error = (code, "scripted replica failure")
    client = make_client([cluster.index(sick), cluster.index(good)])
    if action is Action.NEXT_REPLICA:
        assert client.route([1]).worker_id == "w2"
        assert len(sick.routes) == 0 and len(good.routes) == 1
        return
    with pytest.raises(KvmeshError) as info:
        client.route([1])
    assert info.value.code == code and info.value.message == "scripted replica failure"
    assert good.metadata == []


@pytest.mark.parametrize(("code", "action"), WORKER_ROWS)
def test_worker_row(cluster, generate, code, action) -> None:
    first = FakeWorker("w1", mode="fail")
    first.failure = (code, "scripted worker failure")
    address, second = two_workers(cluster, first)
    if action is Action.NEXT_CANDIDATE:
        result, _ = generate(address, max_tokens=3)
        assert (result.worker_id, result.attempts) == ("w2", 2)
        assert result.token_ids == [100, 101, 102]
        assert len(first.requests) == 1 and len(second.requests) == 1
        return
    with pytest.raises(KvmeshError) as info:
        generate(address, max_tokens=3)
    assert info.value.code == code and info.value.message == "scripted worker failure"
    assert second.requests == []


@pytest.mark.parametrize("code", RETRIED_BY_WORKERS)
def test_failure_after_tokens_restarts_a_generate_but_never_a_stream(cluster, generate,
                                                                     flavour, code) -> None:
    first = FakeWorker("w1", mode="fail")
    first.failure, first.fail_after = (code, "failed mid-generation"), 1
    address, second = two_workers(cluster, first)
    if flavour != "stream":  # nothing was handed out yet: the whole request restarts
        result, _ = generate(address, max_tokens=4)
        assert result.worker_id == "w2" and result.token_ids == [100, 101, 102, 103]
        return
    with pytest.raises(KvmeshError) as info:
        generate(address, max_tokens=4)
    assert info.value.code == code and info.value.chunks == 1
    assert second.requests == []


@pytest.mark.parametrize("code", RETRIED_BY_WORKERS)
def test_a_finished_request_is_never_run_again(cluster, generate, code) -> None:
    first = FakeWorker("w1", mode="fail")
    first.failure, first.fail_after = (code, "failed after the end"), AFTER_FINAL
    address, second = two_workers(cluster, first)
    result, _ = generate(address, max_tokens=3)
    assert result.worker_id == "w1" and result.token_ids == [100, 101, 102]
    assert result.attempts == 1 and second.requests == []


def test_every_candidate_failed_names_every_attempt(cluster, generate) -> None:
    down = closed_port_address()
    full, broken = FakeWorker("w2", mode="fail"), FakeWorker("w3", mode="fail")
    full.failure = (grpc.StatusCode.RESOURCE_EXHAUSTED, "pool too small")
    broken.failure = (grpc.StatusCode.INTERNAL, "engine step failed")
    index = FakeIndex([candidate("w1", down), candidate("w2", cluster.worker(full)),
                       candidate("w3", cluster.worker(broken))])
    with pytest.raises(KvmeshError) as info:
        generate(cluster.index(index))
    assert info.value.code == grpc.StatusCode.INTERNAL  # the last failure's
    message = info.value.message
    assert message.startswith("all 3 candidate worker(s) failed")
    assert down in message and "RESOURCE_EXHAUSTED pool too small" in message
    assert "INTERNAL engine step failed" in message


def test_a_surfaced_error_after_failover_names_the_earlier_attempts(cluster, generate) -> None:
    down, bad = closed_port_address(), FakeWorker("w2", mode="invalid")
    index = FakeIndex([candidate("w1", down), candidate("w2", cluster.worker(bad))])
    with pytest.raises(KvmeshError) as info:
        generate(cluster.index(index))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.message.startswith("prompt longer than the model (after 1 failed")
    assert down in info.value.message


def test_a_hung_replica_is_left_at_the_deadline(cluster, make_client) -> None:
    hung, good = FakeIndex([candidate("w1", "h:1")]), FakeIndex([candidate("w2", "h:2")])
    hung.hang = True
    client = make_client([cluster.index(hung), cluster.index(good)], timeout=0.3)
    assert client.route([1]).worker_id == "w2"
    assert client.route([2]).worker_id == "w2"  # the good replica is asked first from now on
    assert len(hung.metadata) == 1


def test_every_replica_failed_names_every_attempt(cluster, make_client) -> None:
    hung, sick = FakeIndex(), FakeIndex()
    hung.hang = True
    sick.error = (grpc.StatusCode.INTERNAL, "replica bug")
    down = closed_port_address()
    client = make_client([down, cluster.index(hung), cluster.index(sick)], timeout=0.3)
    with pytest.raises(KvmeshError) as info:
        client.stats()
    assert info.value.code == grpc.StatusCode.INTERNAL
    assert info.value.message.startswith("all 3 service replica(s) failed")
    assert down in info.value.message and "DEADLINE_EXCEEDED" in info.value.message
