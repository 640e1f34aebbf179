"""FetchBlocks, the source side, attacked: only the requester the service's ticket names,
proving it with its own key, gets the blocks the ticket names, before it expires. Bearer
tokens (the router's, the worker's own access token) are worth nothing to it."""
from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time

import grpc
import pytest

from kvmesh.rpc.auth import worker_access_token
from kvmesh.transfer import ticket
from kvmesh.transfer.transports import pull
from kvmesh.v1 import worker_pb2
from tests.grpc_codes import status_of
from tests.worker.rpc.peers import BS, chain, generate, generate_request, mint, peers
from worker import Engine
from worker.model import load_model

_RNG = random.Random(5)
PROMPT = [_RNG.randrange(3, 256) for _ in range(4 * BS + 1)]
ACCESS = worker_access_token("router-tok", "src")


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


def engine(tiny) -> Engine:
    model, config = tiny
    return Engine(model, config, block_size=BS, num_blocks=32)


def fetch_request(requester: str, cred: str, hashes, tkt: bytes, **kw):
    return worker_pb2.FetchBlocksRequest(
        requester_id=requester, block_hashes=hashes, ticket=tkt,
        proof=ticket.proof(ticket.peer_key(cred), tkt) if tkt else b"", **kw)


def attack(tiny, make_request, metadata=None, *, source_on: bool = True):
    """Serve PROMPT's blocks on "src" (credential cred-src) beside "dst" (cred-dst) and
    "w3" (cred-w3); FetchBlocks(make_request(src, dst, hashes)): (code, details, src's
    refusals by reason)."""
    async def body():
        async with peers(("src", "cred-src", engine(tiny)), ("dst", "cred-dst", engine(tiny)),
                         peer_fetch=(source_on, True), access_token=ACCESS) as (src, dst):
            auth = [("authorization", f"Bearer {ACCESS}")]
            await generate(src, generate_request(PROMPT), metadata=auth)
            hashes = chain(PROMPT, src.engine)
            call = src.stub.FetchBlocks(make_request(src, dst, hashes), metadata=metadata)
            code, details = await status_of(call)
            return code, details, dict(src.servicer.peer.refusals)

    return asyncio.run(body())


@contextlib.asynccontextmanager
async def holding_prompt(tiny):
    """``src`` holding PROMPT's blocks (generated there once) beside ``dst``, and the
    prompt's chain hashes."""
    async with peers(("src", "cred-src", engine(tiny)),
                     ("dst", "cred-dst", engine(tiny)), access_token=ACCESS) as (src, dst):
        await generate(src, generate_request(PROMPT),
                       metadata=[("authorization", f"Bearer {ACCESS}")])
        yield src, dst, chain(PROMPT, src.engine)


async def granted_header(src, dst, hashes) -> worker_pb2.FetchBlocksResponse:
    """``dst``'s FetchBlocks on ``src`` with the service's ticket: the header."""
    head = None
    async for msg in src.stub.FetchBlocks(fetch_request(
            "dst", "cred-dst", hashes, mint(src, dst, hashes)), timeout=30):
        head = msg
    return head


def test_the_granted_requester_gets_its_blocks_without_any_bearer_token(tiny):
    async def body():
        async with holding_prompt(tiny) as (src, dst, hashes):
            head = await granted_header(src, dst, hashes)
            got: dict[int, bytes] = {}
            n = await pull(head.endpoint, head.block_bytes, head.blocks,
                           lambda i, b: got.__setitem__(i, bytes(b)), 5.0)
            return head, n, got, src.engine

    head, n, got, src = asyncio.run(body())
    assert head.blocks == n == 4 and list(head.token_ids) == PROMPT[:4 * BS]
    assert head.fingerprint == src.fingerprint and head.dtype == "float32"
    block0 = next(iter(src.kv.pool.cached[chain(PROMPT, src)[0]].values())).block_id
    assert got[0] == src.kv_cache[:, :, block0].contiguous().numpy().tobytes()


def test_the_header_comes_while_the_holders_engine_thread_is_busy(tiny):
    """The source reads beside the engine's step: with its engine thread held by a job (as
    by a long step) the header still comes, with every block, read off that thread."""
    async def body():
        async with holding_prompt(tiny) as (src, dst, hashes):
            gate = threading.Event()
            held = src.servicer.runner.call(lambda e: gate.wait(60))
            try:
                head = await granted_header(src, dst, hashes)
                busy = not gate.is_set()
            finally:
                gate.set()
            await held
            return head, busy, src.servicer.peer_source.counters.engine_reads

    head, busy, engine_reads = asyncio.run(body())
    assert busy and head.blocks == 4 and list(head.token_ids) == PROMPT[:4 * BS]
    assert engine_reads == 0


@pytest.mark.parametrize("token", ["router-tok", ACCESS])
def test_a_bearer_token_without_the_requesters_proof_is_refused(tiny, token):
    def req(src, dst, hashes):
        tkt = mint(src, dst, hashes)  # a ticket seen in transit, without dst's key
        return worker_pb2.FetchBlocksRequest(requester_id="dst", block_hashes=hashes,
                                             ticket=tkt, proof=b"\x00" * 32)

    code, details, refusals = attack(tiny, req, [("authorization", f"Bearer {token}")])
    assert code == grpc.StatusCode.PERMISSION_DENIED and "does not verify" in details
    assert refusals == {"forged": 1}


def test_without_a_ticket_is_refused(tiny):
    code, details, refusals = attack(
        tiny, lambda src, dst, hashes: fetch_request("dst", "cred-dst", hashes, b""))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "ticket" in details
    assert refusals == {"no_ticket": 1}


def test_another_workers_ticket_is_refused(tiny):
    def req(src, dst, hashes):  # w3 replays dst's ticket with its own proof
        return fetch_request("w3", "cred-w3", hashes, mint(src, dst, hashes))

    code, _, refusals = attack(tiny, req)
    assert code == grpc.StatusCode.PERMISSION_DENIED and refusals == {"forged": 1}


def test_a_ticket_for_another_requester_under_a_shared_credential_is_not_for_me(tiny):
    def req(src, dst, hashes):  # one shared worker token: every key the same
        tkt = mint(src, "w3", hashes, requester_credential="cred-dst")
        return fetch_request("dst", "cred-dst", hashes, tkt)

    code, details, refusals = attack(tiny, req)
    assert code == grpc.StatusCode.PERMISSION_DENIED and "grants 'w3'" in details
    assert refusals == {"not_for_me": 1}


def test_an_expired_ticket_is_refused(tiny):
    def req(src, dst, hashes):
        old = int(time.time() * 1000) - 60_000
        return fetch_request("dst", "cred-dst", hashes, mint(src, dst, hashes, now_ms=old))

    code, details, refusals = attack(tiny, req)
    assert code == grpc.StatusCode.PERMISSION_DENIED and "expired" in details
    assert refusals == {"expired": 1}


def test_hashes_the_ticket_does_not_grant_are_refused(tiny):
    def req(src, dst, hashes):  # granted the first two blocks, asks for four
        return fetch_request("dst", "cred-dst", hashes, mint(src, dst, hashes[:2]))

    code, details, refusals = attack(tiny, req)
    assert code == grpc.StatusCode.PERMISSION_DENIED and refusals == {"hashes": 1}


def test_a_source_with_the_switch_off_refuses_even_a_valid_ticket(tiny):
    code, details, refusals = attack(
        tiny, lambda src, dst, hashes: fetch_request("dst", "cred-dst", hashes,
                                                     mint(src, dst, hashes)),
        source_on=False)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "--no-peer-fetch" in details
    assert refusals == {"off": 1}


@pytest.mark.parametrize("bad", ["requester", "hash_sizes", "transport"])
def test_malformed_requests_are_invalid(tiny, bad):
    def req(src, dst, hashes):
        r = fetch_request("dst", "cred-dst", hashes, mint(src, dst, hashes))
        if bad == "requester":
            r.requester_id = ""
        elif bad == "hash_sizes":
            r.block_hashes[1] = b"short"
        else:
            r.transport = "carrier-pigeon"
        return r

    code, _, refusals = attack(tiny, req)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and refusals == {"malformed": 1}


def test_a_fetch_is_capped_to_its_byte_budget_and_serves_a_prefix(tiny, monkeypatch):
    from worker.rpc import fetch_call

    async def body():
        async with peers(("src", "cred-src", engine(tiny)),
                         ("dst", "cred-dst", engine(tiny))) as (src, dst):
            monkeypatch.setattr(fetch_call, "MAX_FETCH_BYTES",
                                2 * src.engine.kv_cache[:, :, 0].numel() * 4)
            await generate(src, generate_request(PROMPT))
            hashes = chain(PROMPT, src.engine)
            async for head in src.stub.FetchBlocks(fetch_request(
                    "dst", "cred-dst", hashes, mint(src, dst, hashes))):
                return head

    head = asyncio.run(body())
    assert head.blocks == 2 and list(head.token_ids) == PROMPT[:2 * BS]
