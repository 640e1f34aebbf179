"""``KvmeshClient.generate_stream``: the blocking twin of the async stream, same rule:
chunks then one result, failover only before the first token, closing cancels the call."""
from __future__ import annotations

import grpc
import pytest

from client import GenerateResult, KvmeshClient, KvmeshError
from client.results import TokenChunk
from tests.client.fake_servers import FakeIndex, FakeWorker, candidate, closed_port_address


def test_chunks_then_one_result(cluster) -> None:
    index = FakeIndex()
    w1 = cluster.worker(FakeWorker("w1", cached=2))
    index.candidates = [candidate("w1", w1, matched=2)]
    with KvmeshClient(cluster.index(index), generate_timeout=5) as client:
        items = list(client.generate_stream([1, 2, 3], max_tokens=5, salt="s"))
    chunks, result = items[:-1], items[-1]
    assert all(isinstance(c, TokenChunk) for c in chunks)
    assert [c.token_ids for c in chunks] == [[100, 101], [102, 103], [104]]
    assert all(c.worker_id == "w1" and c.address == w1 for c in chunks)
    assert isinstance(result, GenerateResult)
    assert result.token_ids == [100, 101, 102, 103, 104]
    assert (result.num_cached_tokens, result.attempts, result.matched_tokens) == (2, 1, 2)
    assert index.routes[-1].salt == "s"


@pytest.mark.parametrize("first", ["down", "fails_at_once"])
def test_fails_over_before_the_first_token(cluster, first: str) -> None:
    index = FakeIndex()
    if first == "down":
        w1 = closed_port_address()
    else:
        failing = FakeWorker("w1", mode="fail")
        failing.failure = (grpc.StatusCode.UNAVAILABLE, "draining")
        w1 = cluster.worker(failing)
    w2 = cluster.worker(FakeWorker("w2"))
    index.candidates = [candidate("w1", w1), candidate("w2", w2)]
    with KvmeshClient(cluster.index(index), generate_timeout=5) as client:
        items = list(client.generate_stream([1], max_tokens=2))
    assert [c.worker_id for c in items[:-1]] == ["w2"]
    assert items[-1].attempts == 2 and items[-1].worker_id == "w2"


@pytest.mark.parametrize("mode", ["abort", "truncate"])
def test_no_failover_after_the_first_token(cluster, mode: str) -> None:
    index = FakeIndex()
    spare = FakeWorker("w2")
    index.candidates = [candidate("w1", cluster.worker(FakeWorker("w1", mode=mode))),
                        candidate("w2", cluster.worker(spare))]
    seen = []
    with KvmeshClient(cluster.index(index), generate_timeout=5) as client:
        with pytest.raises(KvmeshError) as info:
            for item in client.generate_stream([1], max_tokens=6):
                seen.append(item)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert [c.token_ids for c in seen] == [[100, 101]]
    assert spare.requests == []


def test_a_surfaced_code_is_not_retried(cluster) -> None:
    index = FakeIndex()
    spare = FakeWorker("w2")
    index.candidates = [candidate("w1", cluster.worker(FakeWorker("w1", mode="invalid"))),
                        candidate("w2", cluster.worker(spare))]
    with KvmeshClient(cluster.index(index), generate_timeout=5) as client:
        with pytest.raises(KvmeshError) as info:
            list(client.generate_stream([1]))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert spare.requests == []


def test_closing_early_cancels_the_worker_call(cluster) -> None:
    index = FakeIndex()
    index.candidates = [candidate("w1", cluster.worker(FakeWorker("w1")))]
    with KvmeshClient(cluster.index(index), generate_timeout=5) as client:
        stream = client.generate_stream([1], max_tokens=40)
        first = next(stream)
        stream.close()  # the generator's finally cancels the call: no error, no leak
        assert first.token_ids == [100, 101]
        assert client.generate([1], max_tokens=2).token_ids == [100, 101]  # client still usable


def test_both_clients_have_the_same_methods_and_signatures() -> None:
    import inspect

    from client import AsyncKvmeshClient

    public = {n for n in dir(KvmeshClient) if not n.startswith("_")}
    assert public == {n for n in dir(AsyncKvmeshClient) if not n.startswith("_")}
    for name in public - {"addresses"}:
        sync, aio = getattr(KvmeshClient, name), getattr(AsyncKvmeshClient, name)
        assert list(inspect.signature(sync).parameters.values()) == \
            list(inspect.signature(aio).parameters.values()), name
    for name in ("route", "generate", "generate_stream"):
        params = inspect.signature(getattr(KvmeshClient, name)).parameters
        assert all(params[p].kind is inspect.Parameter.KEYWORD_ONLY
                   for p in ("lora", "mm", "policy")), name
