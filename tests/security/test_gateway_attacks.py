"""Attacks on the gateway against a real cluster (Valkey, service and a tiny-model worker as
processes): the cache-timing oracle of CVE-2025-46570 and work done before limits.

A victim's 160-byte prompt fills 10 blocks of 16; a caller that repeats it under the same
salt is served 144 tokens from cache, one that shares only its first 32 bytes is served 32.
"""
from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import openai
import pytest

from client.gateway.app import GatewayConfig
from client.gateway.tenants import Tenancy
from deploy.local import ClusterSpec, LocalCluster
from deploy.waiting import wait_until
from tests.client.gateway.conftest import (
    METRICS_KEY,
    SECRET,
    TENANT_KEYS,
    LiveGateway,
    metric_delta,
    metric_samples,
)

pytestmark = pytest.mark.integration  # a real local cluster behind the gateways

FULL_HIT = 144  # (160 - 1) // 16 * 16: the last prompt token is always computed


def victim_prompt() -> str:
    """A fresh 160-byte secret, so tests never see each other's cache."""
    return f"{secrets.token_hex(8)} the launch code is 7491-2207-8812. ".ljust(160, "~")


def wrong_guess(prompt: str) -> str:
    """Shares the first 32 bytes (2 blocks) with ``prompt``, differs after."""
    return prompt[:32] + "X" * (len(prompt) - 32)


@dataclass
class Gateways:
    cluster: LocalCluster
    default: LiveGateway   # no flags at all: what `kvmesh gateway` runs
    tenants: LiveGateway   # --tenant-keys


@pytest.fixture(scope="module")
def gateways() -> Iterator[Gateways]:
    with LocalCluster(ClusterSpec(workers=1, num_blocks=128)) as cluster:
        service = cluster.service_addresses
        default = LiveGateway(GatewayConfig(service=service, generate_timeout=60))
        tenants = LiveGateway(GatewayConfig(service=service, generate_timeout=60,
                                            tenancy=Tenancy(TENANT_KEYS, SECRET)))
        try:
            yield Gateways(cluster, default, tenants)
        finally:
            default.stop()
            tenants.stop()


def cached(gateway: LiveGateway, prompt: str, key: str = "unused", **extra: object) -> int:
    """The cached prompt tokens the gateway reports for one request (all three places
    agree: the header, the total and its split by tier)."""
    raw = gateway.openai(key).completions.with_raw_response.create(
        model="tiny", prompt=prompt, max_tokens=1, temperature=0, extra_body=extra or None)
    usage = raw.parse().usage
    details = usage.prompt_tokens_details
    reported = details.cached_tokens if details and details.cached_tokens else 0
    assert raw.headers["x-kvmesh-cached-tokens"] == str(reported)
    if details:  # the split by tier tells no more than the total
        assert sum(details.cached_tokens_by_tier.values()) == reported
    return reported


def test_default_gateway_is_not_a_cache_oracle(gateways: Gateways) -> None:
    """Attack: the victim sends a secret; the attacker (same gateway, no key, no salt) sends
    the right guess and a wrong one and compares cached tokens. Before the fix: 144 vs 32."""
    gw = gateways.default
    secret = victim_prompt()
    cached(gw, secret)  # the victim
    right, wrong = cached(gw, secret), cached(gw, wrong_guess(secret))
    assert right == wrong == 0
    # a caller that opts in with its own cache_salt still gets, and sees, its own hits
    salt = secrets.token_hex(16)
    assert cached(gw, secret, cache_salt=salt) == 0
    assert cached(gw, secret, cache_salt=salt) == FULL_HIT
    assert cached(gw, secret, cache_salt="another salt") == 0


def test_tenants_see_their_own_hits_and_nobody_elses(gateways: Gateways) -> None:
    gw = gateways.tenants
    secret = victim_prompt()
    cached(gw, secret, "key-acme")
    assert cached(gw, secret, "key-acme") == FULL_HIT  # same tenant: reused and reported
    assert cached(gw, secret, "key-globex") == 0
    assert cached(gw, secret, "key-globex", cache_salt="user-1") == 0


def test_insecure_shared_cache_shares_but_reports_no_hits(gateways: Gateways) -> None:
    """``--insecure-shared-cache`` puts unsalted requests in one cache (the index has their
    unsalted blocks), but never tells a caller how much of it was someone else's; the
    operator's metrics count what the shared cache served (the hits are real)."""
    gw = LiveGateway(GatewayConfig(service=gateways.cluster.service_addresses,
                                   generate_timeout=60, shared_cache=True,
                                   metrics_key=METRICS_KEY))
    try:
        secret = victim_prompt()
        cached(gw, secret)
        ids = list(secret.encode())
        with gateways.cluster.client() as service:  # shared: the index holds the unsalted prefix
            wait_until(lambda: service.route(ids, dry_run=True).matched_tokens >= FULL_HIT,
                       timeout=10)
        before = metric_samples(gw.url)
        assert cached(gw, secret) == cached(gw, wrong_guess(secret)) == 0
        after = metric_samples(gw.url)
        shared = "kvmesh_gateway_shared_cache_cached_tokens_total"
        assert metric_delta(before, after, shared) == FULL_HIT + 32
        assert metric_delta(before, after, "kvmesh_gateway_cached_tokens_total") == 0
    finally:
        gw.stop()


def test_too_long_prompt_is_refused_before_routing(gateways: Gateways) -> None:
    """Attack: a prompt the worker can never take (over the model's 8192-token context). Before
    the fix it was routed, writing a provisional index entry per block, then refused."""
    salt = secrets.token_hex(16)
    long_prompt = "y" * 9000
    client = gateways.default.openai()
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt=long_prompt, max_tokens=8,
                                  extra_body={"cache_salt": salt})
    ids = list(long_prompt.encode())
    with gateways.cluster.client() as service:
        assert service.route(ids, salt=salt, dry_run=True).matched_tokens == 0  # nothing indexed
        assert info.value.body["code"] == "context_length_exceeded"  # the gateway's refusal
        with pytest.raises(openai.BadRequestError):  # prompt fits, + max_tokens does not
            client.completions.create(model="tiny", prompt="y" * 8000, max_tokens=500,
                                      extra_body={"cache_salt": salt})
        client.completions.create(model="tiny", prompt=long_prompt[:100], max_tokens=1,
                                  extra_body={"cache_salt": salt})  # control: this one is
        assert wait_until(lambda: service.route(ids, salt=salt, dry_run=True).matched_tokens >= 96,
                          timeout=10)


def test_batch_over_the_cap_is_refused(gateways: Gateways) -> None:
    client = gateways.default.openai()
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt=["a"] * 17, max_tokens=1)
    assert info.value.body["code"] == "batch_too_large"
    done = client.completions.create(model="tiny", prompt=["a"] * 16, max_tokens=1)
    assert len(done.choices) == 16
