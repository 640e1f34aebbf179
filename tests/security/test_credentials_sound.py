"""The credential parts kept on purpose, each pinned by a test: every token
check is a constant-time comparison, the worker access token is the agreed one-way
derivation of the router token, records keep a fingerprint (never a token), and a service
refuses credential sets that would make the router token a worker credential."""
from __future__ import annotations

import asyncio
import hashlib
import hmac

import grpc
import pytest

from kvmesh.rpc.auth import worker_access_token
from service import worker_tokens
from service.auth import fingerprint
from service.config import ServiceConfig
from service.index.redis.keys import REGISTRY
from tests.service.protocol_worker import ProtocolWorker, route, serve

SECRET = "sound-credentials-test-secret"


def test_every_token_check_is_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through a real service, a wrong router token and a forged bound worker token are
    both compared with ``hmac.compare_digest``, never ``==``."""
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    forged = "a:" + "0" * 64

    async def main() -> None:
        async with serve(ServiceConfig(token="router-tok", worker_secret=SECRET)) as r:
            with pytest.raises(grpc.aio.AioRpcError):
                await route(r.stub, [1, 2, 3], token="wrong-tok")
            with pytest.raises(grpc.aio.AioRpcError):
                await ProtocolWorker(r.stub, "a", token=forged).register()

    asyncio.run(main())
    assert (b"wrong-tok", b"router-tok") in compared
    assert any(a == b"0" * 64 for a, _ in compared)


def test_the_access_token_is_the_agreed_one_way_derivation() -> None:
    key = hmac.new(b"router-tok", b"kvmesh worker access key v2", hashlib.sha256).digest()
    want = hmac.new(key, b"kvmesh worker access v2\x00w1", hashlib.sha256).hexdigest()
    assert worker_access_token("router-tok", "w1") == want
    assert worker_access_token("router-tok", "w1") != worker_access_token("router-tok2", "w1")
    assert worker_access_token("router-tok", "w1") != worker_access_token("router-tok", "w2")
    assert "router-tok" not in worker_access_token("router-tok", "w1")


def test_records_keep_a_fingerprint_never_the_token(redis_url: str) -> None:
    import redis

    token = worker_tokens.mint(SECRET, "a")

    async def main() -> None:
        cfg = ServiceConfig(backend="redis", redis_url=redis_url, worker_secret=SECRET)
        async with serve(cfg) as r:
            await ProtocolWorker(r.stub, "a", token=token).join()

    asyncio.run(main())
    db = redis.Redis.from_url(redis_url, decode_responses=True)
    read = {"hash": db.hgetall, "set": db.smembers}
    stored = " ".join(str(read.get(db.type(k), db.get)(k)) for k in db.keys("*"))
    assert REGISTRY in db.keys("*") and token.split(":")[1] not in stored
    records = [db.hgetall(k) for k in db.keys("kvm:*|a")]
    assert [rec["cred"] for rec in records] == [fingerprint(token)]


@pytest.mark.parametrize("creds", [{"token": "t"},
                                   {"token": "same-as-router", "worker_token": "same-as-router"},
                                   {"token": "same-as-router-16b",
                                    "worker_secret": "same-as-router-16b"}])
def test_the_router_token_cannot_be_made_a_worker_credential(creds: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="worker"):
        ServiceConfig(**creds)  # type: ignore[arg-type]
