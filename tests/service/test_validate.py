"""A Route's prompt arrives as ``token_ids_packed`` (little-endian uint32) or the old repeated
``token_ids``: both read to the same ids and route alike, and every malformed prompt is
refused with INVALID_ARGUMENT (or RESOURCE_EXHAUSTED over the size limit) naming the field,
in the validator and through the real server, leaving the index as it was."""
from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.convert import pack_tokens, route_request, unpack_tokens
from kvmesh.hashing import block_hashes, none_hash
from kvmesh.v1 import index_pb2 as pb
from service import validate
from service.config import ServiceConfig
from service.hash_memo import BlockHashMemo
from service.index.memory import MemoryBackend
from service.validate import RequestError
from tests.grpc_codes import code_of
from tests.service.protocol_worker import BS, ProtocolWorker, prompt, route, serve

CFG = ServiceConfig(max_prompt_tokens=64)
INVALID, TOO_BIG = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED


def packed(ids: list[int]) -> bytes:
    return struct.pack(f"<{len(ids)}I", *ids)


def refused(req: pb.RouteRequest) -> RequestError:
    with pytest.raises(RequestError) as e:
        validate.route(req, CFG)
    return e.value


def test_packed_and_old_field_read_to_the_same_ids() -> None:
    ids = [0, 1, 23, 24, 255, 256, 65535, 65536, 2**32 - 1]
    for req in (pb.RouteRequest(token_ids_packed=packed(ids)), pb.RouteRequest(token_ids=ids),
                pb.RouteRequest(token_ids=ids, token_ids_packed=packed(ids))):
        tokens = validate.route(req, CFG).tokens
        assert tokens.dtype == np.uint32 and tokens.tolist() == ids
        assert not tokens.flags.writeable  # shared with the request bytes: never changed


def test_old_field_keeps_ids_of_2_32_and_above() -> None:
    """What the old field always carried stays routable, hashed by the reference path."""
    ids = [2**32, 2**63 - 1, 7, 9]
    tokens = validate.route(pb.RouteRequest(token_ids=ids), CFG).tokens
    assert tokens.dtype == np.uint64 and tokens.tolist() == ids
    assert BlockHashMemo().block_hashes(tokens, 2) == block_hashes(ids, 2)


def test_packed_bytes_not_a_multiple_of_4_are_refused() -> None:
    for n in (1, 2, 3, 5, 4 * 9 + 3):
        e = refused(pb.RouteRequest(token_ids_packed=b"\x01" * n))
        assert e.code == INVALID and "token_ids_packed" in e.message
        assert f"{n} bytes, not a multiple of 4" in e.message


def test_empty_prompt_is_refused() -> None:
    e = refused(pb.RouteRequest())
    assert e.code == INVALID and "token_ids is empty" in e.message


def test_over_the_limit_is_resource_exhausted_in_either_field() -> None:
    for req in (pb.RouteRequest(token_ids_packed=packed([1] * 65)),
                pb.RouteRequest(token_ids=[1] * 65)):
        e = refused(req)
        assert e.code == TOO_BIG and "65 tokens" in e.message
    assert len(validate.route(pb.RouteRequest(token_ids_packed=packed([1] * 64)),
                              CFG).tokens) == 64


def test_negative_old_ids_are_refused_with_their_index() -> None:
    e = refused(pb.RouteRequest(token_ids=[5, 6, -1, -7]))
    assert e.code == INVALID and "token_ids[2] = -1 is negative" in e.message
    e = refused(pb.RouteRequest(token_ids=[-(2**63)]))
    assert e.code == INVALID and "is negative" in e.message


def test_both_fields_must_agree() -> None:
    ids = [3, 1, 4, 1, 5]
    for other in ([3, 1, 4, 1, 6], [3, 1, 4, 1], [3, 1, 4, 1, 5, 9], [3, 1, 4, 1, 5 + 2**32]):
        e = refused(pb.RouteRequest(token_ids=other, token_ids_packed=packed(ids)))
        assert e.code == INVALID and "both set and differ" in e.message
    # a negative id in the old field is named as such, even next to packed ids
    e = refused(pb.RouteRequest(token_ids=[-3, 1, 4, 1, 5], token_ids_packed=packed(ids)))
    assert "negative" in e.message


def test_prefix_refs_keep_the_old_field_and_its_checks() -> None:
    pin = pb.PinPrefixRequest(prefix=pb.PrefixRef(token_ids=[1, -2]))
    with pytest.raises(RequestError) as e:
        validate.pin(pin, CFG)
    assert e.value.code == INVALID and "prefix.token_ids[1] = -2 is negative" in e.value.message
    ok = validate.pin(pb.PinPrefixRequest(prefix=pb.PrefixRef(token_ids=[1, 2])), CFG)
    assert ok.prefix.tokens is not None and ok.prefix.tokens.tokens.tolist() == [1, 2]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=64),
       st.sampled_from([1, 2, 4, 16]))
def test_any_prompt_packs_reads_and_hashes_like_the_old_field(ids: list[int], bs: int) -> None:
    raw = pack_tokens(ids)
    assert raw == packed(ids) and unpack_tokens(raw) == ids
    via_packed = validate.route(pb.RouteRequest(token_ids_packed=raw), CFG).tokens
    via_old = validate.route(pb.RouteRequest(token_ids=ids), CFG).tokens
    assert via_packed.tolist() == via_old.tolist() == ids
    want = block_hashes(ids, bs)
    assert BlockHashMemo(segment_blocks=2).block_hashes(via_packed, bs) == want
    assert block_hashes(via_packed, bs) == want  # the bulk encoder, no memo


def test_the_client_packs_unless_it_cannot_or_is_told_not_to() -> None:
    assert route_request([1, 2, 3]).token_ids_packed == packed([1, 2, 3])
    assert not route_request([1, 2, 3]).token_ids
    assert route_request(iter([4, 5])).token_ids_packed == packed([4, 5])  # an iterator
    assert route_request(np.array([6, 7])).token_ids_packed == packed([6, 7])
    for ids in ([1, -2], [2**32], [2**40, 1]):  # not uint32: the old field, checked there
        req = route_request(ids)
        assert list(req.token_ids) == ids and not req.token_ids_packed
    old = route_request([1, 2], packed=False)
    assert list(old.token_ids) == [1, 2] and not old.token_ids_packed


def test_through_the_server_packed_and_old_route_alike_and_bad_prompts_are_refused() -> None:
    async def main() -> None:
        backend = MemoryBackend()
        async with serve(ServiceConfig(max_prompt_tokens=64), backend) as svc:
            w = ProtocolWorker(svc.stub, "w1")
            await w.join()
            tokens = prompt(6 * BS + 1)
            await w.store(tokens)
            answers = [await svc.stub.Route(req) for req in (
                pb.RouteRequest(token_ids_packed=packed(tokens)),
                pb.RouteRequest(token_ids=tokens),
                pb.RouteRequest(token_ids=tokens, token_ids_packed=packed(tokens)),
                route_request(tokens))]
            for res in answers:
                assert res.candidates[0].matched_tokens == 6 * BS
                assert res.prompt_tokens == len(tokens)
            before = await backend.workers(with_blocks=True)
            bad = {b"\x01\x02\x03": INVALID, packed([1] * 65): TOO_BIG}
            for raw, code in bad.items():
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await svc.stub.Route(pb.RouteRequest(token_ids_packed=raw))
                assert e.value.code() == code, e.value.details()
                assert "token" in (e.value.details() or "")
            for req in (pb.RouteRequest(token_ids=tokens, token_ids_packed=packed(tokens[1:])),
                        pb.RouteRequest(token_ids=[1, -1])):
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await svc.stub.Route(req)
                assert e.value.code() == INVALID
            assert await backend.workers(with_blocks=True) == before

    asyncio.run(main())


# --- Through the server, bad input gets a precise status code and changes nothing.

H32 = b"\x01" * 32


def test_bad_requests_get_clear_codes_and_change_nothing(redis_url: str) -> None:
    cfg = ServiceConfig(backend="redis", redis_url=redis_url, max_prompt_tokens=100,
                        max_batch_events=10, max_snapshot_blocks=20)

    async def main() -> None:
        async with serve(cfg) as r:
            s = r.stub
            a = ProtocolWorker(s, "a")
            await a.join()
            await a.store(prompt(24))

            async def state() -> tuple:
                st = await s.Stats(pb.StatsRequest())
                res = await route(s, prompt(25))
                return ([(w.worker_id, w.indexed_blocks, w.last_seq) for w in st.workers],
                        [(c.worker_id, c.matched_tokens) for c in res.candidates])

            before = await state()

            def reg(**kw: object) -> Awaitable[object]:
                fields = dict(worker_id="b", address="h:1", model="tiny", block_size=4,
                              hash_algo="sha256_cbor", root_hash=none_hash("sha256_cbor"))
                fields.update(kw)
                return s.RegisterWorker(pb.RegisterWorkerRequest(**fields))  # type: ignore

            def pub(*events: pb.KvEvent, wid: str = "a") -> Awaitable[object]:
                return s.PublishEvents(pb.PublishEventsRequest(worker_id=wid, events=events))

            def stored(*hashes: bytes, parent: bytes = b"") -> pb.BlockStored:
                return pb.BlockStored(block_hashes=hashes, parent_hash=parent)

            nxt = a.seq + 1
            cases = {
                "empty prompt": (route(s, []), INVALID),
                "oversized prompt": (route(s, prompt(101)), TOO_BIG),
                "negative token": (route(s, [1, 2, -3]), INVALID),
                "salt over 4 KiB": (route(s, prompt(8), salt="x" * 4097), INVALID),
                "unknown policy": (route(s, prompt(8), policy="fastest"), INVALID),
                "mm outside prompt": (route(s, prompt(8), mm=[pb.MultimodalItem(
                    identifier="img", offset=6, length=5)]), INVALID),
                "lora without name": (route(s, prompt(8), lora=pb.Lora(path="/x")), INVALID),
                "bad worker id": (reg(worker_id="bad id!"), INVALID),
                "bad address": (reg(address="nowhere"), INVALID),
                "unknown algo": (reg(hash_algo="md5"), INVALID),
                "short root hash": (reg(root_hash=b"\x00" * 16), INVALID),
                "zero block size": (reg(block_size=0), INVALID),
                "free > total": (s.Heartbeat(pb.HeartbeatRequest(worker_id="a", load=pb.WorkerLoad(
                    free_blocks=5, total_blocks=4))), INVALID),
                "unknown worker events": (pub(pb.KvEvent(seq=1, stored=stored(H32)), wid="zz"),
                                          grpc.StatusCode.NOT_FOUND),
                "short block hash": (pub(pb.KvEvent(seq=nxt, stored=stored(b"\x01" * 31))),
                                     INVALID),
                "short parent hash": (pub(pb.KvEvent(seq=nxt, stored=stored(H32, parent=b"\x02"))),
                                      INVALID),
                "empty stored": (pub(pb.KvEvent(seq=nxt, stored=stored())), INVALID),
                "no event kind": (pub(pb.KvEvent(seq=nxt)), INVALID),
                "seq 0": (pub(pb.KvEvent(seq=0, cleared=pb.AllBlocksCleared())), INVALID),
                "out of order": (pub(pb.KvEvent(seq=nxt, cleared=pb.AllBlocksCleared()),
                                     pb.KvEvent(seq=nxt + 2, cleared=pb.AllBlocksCleared())),
                                 INVALID),
                "valid then malformed": (pub(pb.KvEvent(seq=nxt, cleared=pb.AllBlocksCleared()),
                                             pb.KvEvent(seq=nxt + 1, stored=stored(b"x"))),
                                         INVALID),
                "too many events": (pub(*[pb.KvEvent(seq=nxt + i, cleared=pb.AllBlocksCleared())
                                          for i in range(11)]), TOO_BIG),
                "snapshot bad hash": (s.SyncWorker(pb.SyncWorkerRequest(
                    worker_id="a", seq=9, blocks=[stored(b"\x01")])), INVALID),
                "snapshot too big": (s.SyncWorker(pb.SyncWorkerRequest(
                    worker_id="a", seq=9, blocks=[stored(*[H32] * 21)])), TOO_BIG),
                "snapshot unknown worker": (s.SyncWorker(pb.SyncWorkerRequest(
                    worker_id="zz", seq=1)), grpc.StatusCode.NOT_FOUND),
            }
            for name, (call, want) in cases.items():
                assert await code_of(call) == want, name
            assert await state() == before

    asyncio.run(main())


def test_default_prompt_limit_is_one_million_tokens() -> None:
    async def main() -> None:
        async with serve(ServiceConfig()) as r:
            await ProtocolWorker(r.stub, "a").join()
            assert await code_of(route(r.stub, [1] * 1_000_001)) == TOO_BIG

    asyncio.run(main())


@pytest.mark.parametrize("name", ["fetch_us_per_block", "fetch_us_per_call"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_a_load_with_a_bad_fetch_cost_is_refused_naming_it(name: str, value: float) -> None:
    with pytest.raises(RequestError) as e:
        validate.load(pb.WorkerLoad(**{name: value}))
    assert e.value.code == INVALID and f"load.{name}" in e.value.message


def test_a_load_keeps_its_fetch_costs_and_switch() -> None:
    load = validate.load(pb.WorkerLoad(fetch_us_per_block=12.5, fetch_us_per_call=800.0,
                                       peer_fetch=True, free_empty_blocks=0))
    assert (load.fetch_us_per_block, load.fetch_us_per_call, load.peer_fetch) == (
        12.5, 800.0, True)
    assert validate.load(pb.WorkerLoad()).peer_fetch is False


def test_a_route_names_at_most_one_well_formed_worker() -> None:
    assert validate.route(pb.RouteRequest(token_ids=[1], worker_id="w-1"), CFG).worker_id \
        == "w-1"
    assert validate.route(pb.RouteRequest(token_ids=[1]), CFG).worker_id == ""
    err = refused(pb.RouteRequest(token_ids=[1], worker_id="bad id!"))
    assert err.code == INVALID and "worker_id" in err.message


@pytest.mark.parametrize("name,rule", [("a b", "spaces"), ("x\n", "control"),
                                       ("t" * 65, "limit is 64"), ("*", "reserved"),
                                       ("(other)", "reserved")])
def test_a_bad_tenant_is_refused_with_the_rule_it_broke(name: str, rule: str) -> None:
    err = refused(pb.RouteRequest(token_ids=[1], tenant=name))
    assert err.code == INVALID and rule in err.message and "RouteRequest.tenant" in err.message


def test_a_route_carries_its_tenant_and_no_tenant_is_the_default() -> None:
    assert validate.route(pb.RouteRequest(token_ids=[1], tenant="acme"), CFG).tenant == "acme"
    assert validate.route(pb.RouteRequest(token_ids=[1]), CFG).tenant == "default"


def test_through_the_server_a_tenant_changes_no_match_and_a_bad_one_is_refused() -> None:
    """The tenant is a label: the same prompt matches the same blocks whoever asks; a name
    check_tenant refuses is INVALID_ARGUMENT with its message, and the index is unchanged."""
    async def main() -> None:
        backend = MemoryBackend()
        async with serve(ServiceConfig(max_prompt_tokens=64), backend) as svc:
            w = ProtocolWorker(svc.stub, "w1")
            await w.join()
            tokens = prompt(3 * BS + 1)
            await w.store(tokens)
            for name in ("", "acme", "globex"):
                res = await svc.stub.Route(route_request(tokens, tenant=name or None))
                assert res.candidates[0].matched_tokens == 3 * BS
            before = await backend.workers(with_blocks=True)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await svc.stub.Route(pb.RouteRequest(token_ids=tokens, tenant="two words"))
            assert e.value.code() == INVALID and "spaces" in (e.value.details() or "")
            assert await backend.workers(with_blocks=True) == before

    asyncio.run(main())
