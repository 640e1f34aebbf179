"""PinPrefix / UnpinPrefix on a real service: which workers are called, with what request
and credential, what the answer says for each (an unreachable or refusing worker is an
error entry, not a failed RPC), admin-only authorisation, and validation."""
from __future__ import annotations

import asyncio
import math

import grpc
import pytest

from kvmesh.rpc.auth import worker_access_token, worker_pin_token
from kvmesh.v1 import index_pb2 as pb
from service import worker_tokens
from service.config import ServiceConfig
from tests.grpc_codes import code_of
from tests.ports import closed_port_address
from tests.service.pin_workers import PinWorker, pin_workers
from tests.service.protocol_worker import BS, ProtocolWorker, meta, prompt, serve

SECRET = "pin-test-worker-secret"
ADMIN = "admin-tok"
SECURE = dict(token="router-tok", worker_secret=SECRET, admin_token=ADMIN)
PREFIX = prompt(4 * BS + 2)  # 4 full blocks


def pin_token(worker_id: str) -> str:
    """What a worker started with its minted service token requires on Pin."""
    return worker_pin_token(worker_tokens.mint(SECRET, worker_id))


def ref(tokens: list[int] | None = None, **kw: object) -> pb.PrefixRef:
    return pb.PrefixRef(token_ids=PREFIX if tokens is None else tokens, **kw)  # type: ignore


async def join(stub, wid: str, port: int, holds: list[int] | None = None,
               salt: str | None = None, **load: int) -> ProtocolWorker:
    w = ProtocolWorker(stub, wid, port=port, token=worker_tokens.mint(SECRET, wid))
    await w.join(**load)
    if holds:
        await w.store(holds, salt=salt)
    return w


def by_id(res) -> dict[str, pb.PinnedWorker]:
    return {w.worker_id: w for w in res.workers}


def test_pin_goes_to_every_holder_with_its_own_credential() -> None:
    """max_workers 0: every holder (whole chain or part of it), none of the others; each is
    called with the pin token derived from its own minted credential, no warming, the
    service's default TTL."""
    async def main() -> None:
        async with pin_workers(*(PinWorker(token=pin_token(w)) for w in "abc")) as (a, b, c), \
                serve(ServiceConfig(**SECURE)) as r:  # type: ignore[arg-type]
            await join(r.stub, "a", a.port, holds=PREFIX)
            await join(r.stub, "b", b.port, holds=PREFIX[:BS + 1])  # block 0 only
            await join(r.stub, "c", c.port, holds=prompt(4 * BS, start=500))
            res = await r.stub.PinPrefix(pb.PinPrefixRequest(prefix=ref()), metadata=meta(ADMIN))
            assert res.chain_blocks == 4
            assert {w: (p.pinned_blocks, p.error) for w, p in by_id(res).items()} == {
                "a": (4, ""), "b": (4, "")}
            assert not c.calls
            for w in (a, b):
                sent = w.calls[-1]
                assert list(sent.token_ids) == PREFIX and not sent.block_hashes
                assert (sent.warm, sent.unpin, sent.ttl_s) == (False, False, 600.0)
            assert a.tokens == [f"Bearer {pin_token('a')}"]  # never the router/admin token

    asyncio.run(main())


def test_max_workers_warms_the_best_others_when_too_few_hold_it() -> None:
    """max_workers 2 with one holder: the holder and the best (least loaded) non-holder,
    both asked to warm; a prefix given by block hashes cannot be warmed: its holder only."""
    async def main() -> None:
        async with pin_workers(*(PinWorker() for _ in range(3))) as (a, b, c), \
                serve(ServiceConfig(worker_secret=SECRET)) as r:
            await join(r.stub, "a", a.port, holds=PREFIX)
            await join(r.stub, "b", b.port, queued_prefill_tokens=10_000)  # busy
            pa = await join(r.stub, "c", c.port)
            res = await r.stub.PinPrefix(pb.PinPrefixRequest(prefix=ref(), max_workers=2,
                                                             ttl_s=30.0))
            assert sorted(by_id(res)) == ["a", "c"] and not b.calls
            assert [(w.calls[-1].warm, w.calls[-1].ttl_s) for w in (a, c)] == [(True, 30.0)] * 2
            chain = pa.hashes(PREFIX)
            res = await r.stub.PinPrefix(pb.PinPrefixRequest(
                prefix=pb.PrefixRef(block_hashes=chain), max_workers=2))
            assert [w.worker_id for w in res.workers] == ["a"]
            assert list(a.calls[-1].block_hashes) == chain and not a.calls[-1].warm
            assert not a.calls[-1].token_ids and res.chain_blocks == 4

    asyncio.run(main())


def test_salt_lora_and_mm_reach_the_workers_and_pick_the_holders() -> None:
    """The service hashes the prefix with its salt as the workers do: only the holder of the
    salted chain is a holder; the worker gets the same salt, LoRA-free, mm-free request."""
    async def main() -> None:
        async with pin_workers(PinWorker(), PinWorker()) as (a, b), \
                serve(ServiceConfig()) as r:
            await join(r.stub, "a", a.port, holds=PREFIX, salt="tenant-1")
            await join(r.stub, "b", b.port, holds=PREFIX)  # unsalted
            res = await r.stub.PinPrefix(pb.PinPrefixRequest(prefix=ref(salt="tenant-1")))
            assert [w.worker_id for w in res.workers] == ["a"] and a.calls[-1].salt == "tenant-1"
            await r.stub.PinPrefix(pb.PinPrefixRequest(prefix=ref(
                salt="tenant-1", lora=pb.Lora(name="ad", path="/p"),
                mm=[pb.MultimodalItem(identifier="img", offset=1, length=3)]), max_workers=1))
            sent = b.calls[-1] if b.calls else a.calls[-1]
            assert (sent.lora.name, sent.lora.path) == ("ad", "/p")
            assert [(m.identifier, m.offset, m.length) for m in sent.mm] == [("img", 1, 3)]

    asyncio.run(main())


def test_unreachable_and_refusing_workers_are_errors_in_the_answer() -> None:
    async def main() -> None:
        async with pin_workers(PinWorker(), PinWorker(refuse=True)) as (a, b), \
                serve(ServiceConfig(pin_timeout_s=5.0)) as r:
            await join(r.stub, "a", a.port, holds=PREFIX)
            await join(r.stub, "b", b.port, holds=PREFIX)
            gone = ProtocolWorker(r.stub, "gone", port=int(closed_port_address().split(":")[1]))
            await gone.join()
            await gone.store(PREFIX)
            res = by_id(await r.stub.PinPrefix(pb.PinPrefixRequest(prefix=ref())))
            assert (res["a"].pinned_blocks, res["a"].error) == (4, "")
            assert res["b"].error == "INVALID_ARGUMENT: refused by script"
            assert res["gone"].error.startswith("UNAVAILABLE") and not res["gone"].pinned_blocks

    asyncio.run(main())


def test_unpin_goes_to_every_live_worker() -> None:
    async def main() -> None:
        async with pin_workers(PinWorker(token=pin_token("a")),
                               PinWorker(token=pin_token("b"))) as (a, b), \
                serve(ServiceConfig(**SECURE)) as r:  # type: ignore[arg-type]
            await join(r.stub, "a", a.port, holds=PREFIX)
            await join(r.stub, "b", b.port)  # holds nothing in the index: asked anyway
            res = await r.stub.UnpinPrefix(pb.UnpinPrefixRequest(prefix=ref(salt="s")),
                                           metadata=meta(ADMIN))
            assert sorted(by_id(res)) == ["a", "b"] and all(not w.error for w in res.workers)
            for w in (a, b):
                assert w.calls[-1].unpin and w.calls[-1].salt == "s"

    asyncio.run(main())


def test_a_shared_worker_token_is_tried_after_the_minted_one() -> None:
    """A service with both a worker secret and a shared worker token: a worker that joined
    with the shared token takes the pin token derived from it (the minted one first)."""
    async def main() -> None:
        shared = "shared-worker-tok"
        async with pin_workers(PinWorker(token=worker_pin_token(shared))) as (a,), \
                serve(ServiceConfig(worker_secret=SECRET, worker_token=shared)) as r:
            w = ProtocolWorker(r.stub, "a", port=a.port, token=shared)
            await w.join()
            await w.store(PREFIX)
            res = await r.stub.PinPrefix(pb.PinPrefixRequest(prefix=ref()))
            assert (res.workers[0].pinned_blocks, res.workers[0].error) == (4, "")
            assert a.tokens == [f"Bearer {pin_token('a')}",
                                f"Bearer {worker_pin_token(shared)}"]

    asyncio.run(main())


@pytest.mark.parametrize("cfg, allowed, refused", [
    (SECURE, [ADMIN], [None, "router-tok", worker_tokens.mint(SECRET, "a"), "wrong"]),
    # a router token but no admin token: nobody may pin, the router token included
    (dict(token="router-tok", worker_secret=SECRET), [], [None, "router-tok"]),
    # an admin token alone guards only the admin calls
    (dict(admin_token=ADMIN), [ADMIN], [None, "router-tok"]),
    # no router token (routes open to anyone) and no admin token: as open as Route
    (dict(worker_secret=SECRET), [None, "anything"], []),
    (dict(), [None, "anything"], []),  # no token at all: open, like every call
])
def test_only_the_admin_token_pins(cfg: dict, allowed: list, refused: list) -> None:
    async def main() -> None:
        async with serve(ServiceConfig(**cfg)) as r:
            w = ProtocolWorker(r.stub, "a", token=worker_tokens.mint(SECRET, "a"))
            await w.join()
            for token in allowed + refused:
                want = grpc.StatusCode.OK if token in allowed else grpc.StatusCode.UNAUTHENTICATED
                for call in (r.stub.PinPrefix(pb.PinPrefixRequest(prefix=ref()),
                                              metadata=meta(token)),
                             r.stub.UnpinPrefix(pb.UnpinPrefixRequest(prefix=ref()),
                                                metadata=meta(token))):
                    assert await code_of(call) == want, token
            if cfg.get("token"):  # the admin token is not a router token
                assert await code_of(r.stub.Stats(pb.StatsRequest(), metadata=meta(ADMIN))) \
                    == grpc.StatusCode.UNAUTHENTICATED

    asyncio.run(main())


def test_an_admin_token_equal_to_another_credential_is_refused() -> None:
    for clash in (dict(token="same"), dict(worker_token="same"), dict(worker_secret="same" * 4)):
        other = {"worker_secret": SECRET, **clash}
        with pytest.raises(ValueError, match="admin token must differ"):
            ServiceConfig(admin_token=next(iter(clash.values())), **other)  # type: ignore


INVALID, TOO_BIG = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize("request_, code", [
    (pb.PinPrefixRequest(), INVALID),                                     # no prefix
    (pb.PinPrefixRequest(prefix=pb.PrefixRef(token_ids=[1, -2])), INVALID),
    (pb.PinPrefixRequest(prefix=pb.PrefixRef(token_ids=[1], block_hashes=[b"\x01" * 32])),
     INVALID),
    (pb.PinPrefixRequest(prefix=pb.PrefixRef(block_hashes=[b"\x01" * 32], salt="s")), INVALID),
    (pb.PinPrefixRequest(prefix=pb.PrefixRef(block_hashes=[b"\x01" * 32, b"\x01" * 16])),
     INVALID),
    (pb.PinPrefixRequest(prefix=pb.PrefixRef(block_hashes=[b"\x01" * 20])), INVALID),
    (pb.PinPrefixRequest(prefix=pb.PrefixRef(block_hashes=[b"\x01" * 16])), INVALID),  # no
    (pb.PinPrefixRequest(prefix=pb.PrefixRef(block_hashes=[b"\x01" * 32] * 8193)), TOO_BIG),
    (pb.PinPrefixRequest(prefix=pb.PrefixRef(token_ids=[1] * 1_000_001)), TOO_BIG),
    (pb.PinPrefixRequest(prefix=ref(), ttl_s=math.nan), INVALID),
    (pb.PinPrefixRequest(prefix=ref(), ttl_s=-1.0), INVALID),
    (pb.PinPrefixRequest(prefix=ref(), ttl_s=86_401.0), INVALID),
    (pb.PinPrefixRequest(prefix=ref(model="other")), grpc.StatusCode.UNAVAILABLE),
    (pb.PinPrefixRequest(prefix=ref(prompt(BS - 1)), max_workers=1), INVALID),  # < 1 block
])
def test_bad_pins_are_refused_and_call_no_worker(request_: pb.PinPrefixRequest,
                                                 code: grpc.StatusCode) -> None:
    """(16-byte hashes: no live worker of the model uses them.)"""
    async def main() -> None:
        async with pin_workers(PinWorker()) as (a,), serve(ServiceConfig()) as r:
            await join(r.stub, "a", a.port, holds=PREFIX)
            assert await code_of(r.stub.PinPrefix(request_)) == code
            unpin = pb.UnpinPrefixRequest(prefix=request_.prefix)
            if code != grpc.StatusCode.UNAVAILABLE and request_.HasField("prefix") \
                    and request_.ttl_s == 0 and len(request_.prefix.token_ids) != BS - 1:
                assert await code_of(r.stub.UnpinPrefix(unpin)) == code
            assert not a.calls

    asyncio.run(main())


def test_no_worker_credential_sends_the_access_token() -> None:
    """An open cluster's service (no worker credential) presents what it has: the worker
    access token of its router token, if any (workers then guard Pin with it)."""
    from service.pins import pin_credentials

    assert pin_credentials(ServiceConfig(), "a") == [None]
    cfg = ServiceConfig(token="r", worker_secret=SECRET, worker_token="w-shared")
    assert pin_credentials(cfg, "a") == [pin_token("a"), worker_pin_token("w-shared")]
    assert worker_access_token("r", "a") not in pin_credentials(cfg, "a")
