"""kvmesh.rpc.auth: the per-worker access token and the verifiers a worker checks it with."""
from __future__ import annotations

import hashlib
import hmac

import pytest

from kvmesh.rpc.auth import (
    Grant,
    WorkerAccess,
    shared_token,
    worker_access_key,
    worker_access_token,
)


def test_each_worker_gets_its_own_token_from_one_key() -> None:
    key = hmac.new(b"router", b"kvmesh worker access key v2", hashlib.sha256).digest()
    assert worker_access_key("router") == key
    assert worker_access_token("router", "w1") == hmac.new(
        key, b"kvmesh worker access v2\x00w1", hashlib.sha256).hexdigest()
    access = WorkerAccess("router")
    tokens = {access.token(f"w{i}") for i in range(200)}
    assert len(tokens) == 200  # no two workers share a token
    assert access.token("w1") == worker_access_token("router", "w1")
    assert worker_access_token("router", "w1") != worker_access_token("router2", "w1")


def test_the_token_reveals_neither_the_router_token_nor_the_key() -> None:
    access = WorkerAccess("router-secret")
    token = access.token("w1")
    assert "router-secret" not in token and worker_access_key("router-secret").hex() != token
    assert "router-secret" not in repr(access) and worker_access_key(
        "router-secret").hex() not in repr(access)
    # domain separation: it is neither the router token's plain HMAC of the id nor the
    # bound worker credential's form, and ids that concatenate alike do not collide
    assert token != hmac.new(b"router-secret", b"w1", hashlib.sha256).hexdigest()
    assert access.token("w1") != access.token("w1\x00")


def test_empty_router_token_or_worker_id_is_refused() -> None:
    with pytest.raises(ValueError, match="router token"):
        worker_access_token("", "w1")
    with pytest.raises(ValueError, match="worker_id"):
        worker_access_token("router", "")


def test_shared_token_may_be_known_only_later_and_refuses_until_then() -> None:
    late: list[str | None] = [None]
    verify = shared_token("client", lambda: late[0])
    assert verify("anything") is None and verify("") is None  # never open meanwhile
    late[0] = worker_access_token("router", "w1")
    assert verify(late[0]) == Grant("client")
    assert verify(worker_access_token("router", "w2")) is None
    assert shared_token("client", "abc")("abc") == Grant("client")
    assert shared_token("client", "abc")("abd") is None
