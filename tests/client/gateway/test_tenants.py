"""Tenant keys: API-key auth and server-derived salts that no tenant can choose."""
from __future__ import annotations

import hashlib
import hmac
import json
import urllib.error
import urllib.request

import openai
import pytest

from client.gateway.app import GatewayConfig
from client.gateway.tenants import Tenancy, TenantKeyError, parse_tenant_keys
from tests.client.gateway.conftest import SECRET, LiveGateway, Stack


def expected_salt(tenant: str, cache_salt: str | None = None) -> str:
    """The documented derivation, recomputed independently of the gateway's code."""
    message = b"kvmesh-tenant\0" + tenant.encode()
    if cache_salt:
        message += b"\0" + cache_salt.encode()
    return hmac.new(SECRET.encode(), message, hashlib.sha256).hexdigest()


def salt_of_request(stack: Stack, api_key: str, **extra: object) -> str:
    client = stack.tenant_gateway.openai(api_key)
    client.completions.create(model="tiny", prompt="shared system prompt", max_tokens=1,
                              extra_body=extra or None)
    route_salt = stack.index.routes[-1].salt
    assert stack.last_request.salt == route_salt  # index and worker hash with the same salt
    return route_salt


def test_unknown_or_missing_key_is_401(stack: Stack) -> None:
    with pytest.raises(openai.AuthenticationError) as info:
        stack.tenant_gateway.openai("key-nobody").completions.create(model="tiny", prompt="x")
    assert info.value.status_code == 401
    assert info.value.body["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        stack.tenant_gateway.openai("key-nobody").models.list()
    req = urllib.request.Request(f"{stack.tenant_gateway.url}/v1/chat/completions",
                                 data=b'{"model": "tiny"}', method="POST",
                                 headers={"content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(req, timeout=10)
    assert http.value.code == 401  # auth comes before validating the body's fields
    assert json.loads(http.value.read())["error"]["type"] == "invalid_request_error"
    assert stack.index.routes == []


def test_tenants_get_different_server_derived_salts(stack: Stack) -> None:
    acme = salt_of_request(stack, "key-acme")
    globex = salt_of_request(stack, "key-globex")
    assert acme == expected_salt("acme")
    assert globex == expected_salt("globex")
    assert acme != globex
    assert salt_of_request(stack, "key-acme") == acme  # stable: the tenant shares its cache


def test_a_tenant_cannot_choose_another_tenants_salt(stack: Stack) -> None:
    globex = expected_salt("globex")
    forged = salt_of_request(stack, "key-acme", cache_salt=globex)
    assert forged != globex
    assert forged == expected_salt("acme", globex)  # narrowed within acme, never globex's
    assert salt_of_request(stack, "key-acme", cache_salt="user-1") != expected_salt("acme")


def test_tenant_streams_are_salted_too(stack: Stack) -> None:
    client = stack.tenant_gateway.openai("key-globex")
    stream = client.chat.completions.create(model="tiny", stream=True, max_tokens=2,
                                            messages=[{"role": "user", "content": "x"}])
    assert "".join(c.choices[0].delta.content or "" for c in stream) == "de"
    assert stack.last_request.salt == expected_salt("globex")


def test_the_api_keys_tenant_reaches_the_service_and_the_worker(stack: Stack) -> None:
    """With tenant keys every request carries its key's tenant (batches, chats and streams,
    to the index and to the worker); without them, no tenant (the default)."""
    acme = stack.tenant_gateway.openai("key-acme")
    acme.completions.create(model="tiny", prompt=["a", "b"], max_tokens=1)
    assert [r.tenant for r in stack.index.routes] == ["acme", "acme"]
    assert [r.tenant for r in stack.w1.requests] == ["acme", "acme"]
    stream = stack.tenant_gateway.openai("key-globex").chat.completions.create(
        model="tiny", stream=True, max_tokens=2, messages=[{"role": "user", "content": "x"}])
    assert "".join(c.choices[0].delta.content or "" for c in stream) == "de"
    assert stack.index.routes[-1].tenant == stack.last_request.tenant == "globex"
    stack.gateway.openai().completions.create(model="tiny", prompt="x", max_tokens=1)
    assert stack.index.routes[-1].tenant == stack.last_request.tenant == ""


def test_key_file_formats() -> None:
    lines = "# API key  tenant\nkey-1 acme\n\nkey-2   globex  # trailing comment\n"
    assert parse_tenant_keys(lines) == {"key-1": "acme", "key-2": "globex"}
    assert parse_tenant_keys('{"key-1": "acme"}') == {"key-1": "acme"}
    for bad in ("key-1\n", "key-1 a b\n", "{not json", '{"k": ""}', "k a\nk b\n", "# none\n"):
        with pytest.raises(TenantKeyError):
            parse_tenant_keys(bad)
    # tenant names travel as RouteRequest.tenant: the wire's rules hold at start
    for bad, rule in (('{"k": "Acme Corp"}', "spaces"), ('{"k": "*"}', "reserved"),
                      ("k " + "t" * 65, "limit is 64")):
        with pytest.raises(TenantKeyError, match=rule):
            parse_tenant_keys(bad)
    with pytest.raises(TenantKeyError, match="reserved"):
        Tenancy({"k": "(other)"}, "s")


def test_tenancy_auth_header_parsing_and_secret() -> None:
    tenancy = Tenancy({"k1": "acme"}, "s")
    assert tenancy.tenant_for("Bearer k1") == "acme"
    assert tenancy.tenant_for("bearer  k1 ") == "acme"
    for header in (None, "", "k1", "Basic k1", "Bearer ", "Bearer k2"):
        assert tenancy.tenant_for(header) is None
    assert tenancy.tenants == {"acme"}
    assert not tenancy.random_secret
    assert Tenancy({"k1": "acme"}, "other").salt("acme") != tenancy.salt("acme")
    assert Tenancy({"k1": "acme"}).random_secret


def test_every_answer_names_its_cache_scope(stack: Stack) -> None:
    """A benchmark that saw 0% reuse was never told why: an answer served under a random
    salt says so, and how to share; the others name the cache they share."""
    def scope(gateway, key: str = "unused", stream: bool = False, **extra: object) -> str:
        raw = gateway.openai(key).completions.with_raw_response.create(
            model="tiny", prompt="x", max_tokens=1, stream=stream, extra_body=extra or None)
        if stream:
            list(raw.parse())
        return raw.headers["x-kvmesh-cache-scope"]

    private = scope(stack.gateway)
    assert private.startswith("request;")
    assert "cache_salt" in private and "--tenant-keys" in private
    assert scope(stack.gateway, stream=True) == private
    assert scope(stack.gateway, cache_salt="team-1") == "cache_salt"
    assert scope(stack.tenant_gateway, "key-acme") == "tenant"
    assert scope(stack.tenant_gateway, "key-acme", stream=True, cache_salt="u1") == "tenant"
    shared = LiveGateway(GatewayConfig(service=stack.index_address, shared_cache=True))
    try:
        assert scope(shared) == "shared"
        assert scope(shared, cache_salt="team-1") == "cache_salt"
    finally:
        shared.stop()
