"""A Route's prompt arrives as ``token_ids_packed`` (little-endian uint32) or the old repeated
``token_ids``: both read to the same ids and route alike, and every malformed prompt is
refused with INVALID_ARGUMENT (or RESOURCE_EXHAUSTED over the size limit) naming the field,
in the validator and through the real server, leaving the index as it was."""
from __future__ import annotations

import asyncio
import struct

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.convert import pack_tokens, route_request, unpack_tokens
from kvmesh.hashing import block_hashes
from kvmesh.v1 import index_pb2 as pb
from service import validate
from service.config import ServiceConfig
from service.hash_memo import BlockHashMemo
from service.index.memory import MemoryBackend
from service.validate import RequestError
from tests.service.protocol_worker import BS, ProtocolWorker, prompt, serve

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
