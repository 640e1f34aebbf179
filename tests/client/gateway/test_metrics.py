"""``GET /metrics`` on the gateway's API port (for the metrics key only) and on its own
listener: requests by status, TTFT, cached tokens."""
from __future__ import annotations

import urllib.error
import urllib.request

from client.gateway.app import GatewayConfig
from client.gateway.metrics import GatewayMetrics
from tests.client.gateway.conftest import (
    METRICS_KEY,
    W1_CACHED,
    LiveGateway,
    Stack,
    metric_delta,
    metric_samples,
)


def test_metrics_count_requests_ttft_and_cached_tokens(stack: Stack) -> None:
    url = stack.gateway.url
    before = metric_samples(url)
    client = stack.gateway.openai()
    client.completions.create(model="tiny", prompt="hello", max_tokens=2)
    stream = client.completions.create(model="tiny", prompt="hello", max_tokens=2,
                                       stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == "de"
    try:
        urllib.request.urlopen(f"{url}/nothing-here", timeout=5)
    except urllib.error.HTTPError as err:
        assert err.code == 404
    after = metric_samples(url)
    path = "/v1/completions"
    requests = "kvmesh_gateway_requests_total"
    assert metric_delta(before, after, requests, path=path, status="200") == 2
    assert metric_delta(before, after, requests, path="other", status="404") == 1
    assert metric_delta(before, after, "kvmesh_gateway_ttft_seconds_count") == 2
    assert metric_delta(before, after, "kvmesh_gateway_ttft_seconds_sum") > 0
    assert metric_delta(before, after, "kvmesh_gateway_prompt_tokens_total") == 2 * len("hello")
    assert metric_delta(before, after, "kvmesh_gateway_cached_tokens_total") == 2 * W1_CACHED


def test_metrics_count_refused_requests(stack: Stack) -> None:
    url = stack.tenant_gateway.url
    before = metric_samples(url)
    req = urllib.request.Request(f"{url}/v1/completions", data=b"{}", method="POST",
                                 headers={"content-type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=5)
    except urllib.error.HTTPError as err:
        assert err.code == 401
    after = metric_samples(url)
    assert metric_delta(before, after, "kvmesh_gateway_requests_total",
                        path="/v1/completions", status="401") == 1
    assert metric_delta(before, after, "kvmesh_gateway_ttft_seconds_count") == 0


def _status(url: str | urllib.request.Request, authorization: str | None = None) -> int:
    headers = {"authorization": authorization} if authorization else {}
    req = url if isinstance(url, urllib.request.Request) else urllib.request.Request(
        url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5):
            return 200
    except urllib.error.HTTPError as err:
        return err.code


def test_metrics_on_the_api_port_need_the_metrics_key_not_a_tenant_key(stack: Stack) -> None:
    """The counters sum every tenant's cache hits: a tenant key, or none, reads nothing."""
    url = f"{stack.tenant_gateway.url}/metrics"
    assert _status(url) == 401
    assert _status(url, "Bearer key-acme") == 401  # a valid tenant key
    assert _status(url, f"Bearer {METRICS_KEY}x") == 401
    assert _status(url, f"Bearer {METRICS_KEY}") == 200


def test_without_a_metrics_key_the_api_port_serves_no_metrics(stack: Stack) -> None:
    gateway = LiveGateway(GatewayConfig(service=stack.index_address))
    try:
        assert _status(f"{gateway.url}/metrics") == 404
        assert _status(f"{gateway.url}/metrics", "Bearer anything") == 404
    finally:
        gateway.stop()


def test_metrics_on_their_own_loopback_listener(stack: Stack) -> None:
    metrics = GatewayMetrics()
    metrics.prompt_tokens.inc(5)
    port = metrics.serve(0)
    assert metric_samples(f"http://127.0.0.1:{port}", key=None)[
        ("kvmesh_gateway_prompt_tokens_total", ())] == 5


def test_shared_cache_hits_are_counted_for_the_operator_only(stack: Stack) -> None:
    """``--insecure-shared-cache`` hides each caller's cached count (so callers cannot probe
    one another), but the operator's metrics count what the cache served."""
    gw = LiveGateway(GatewayConfig(service=stack.index_address, shared_cache=True,
                                   metrics_key=METRICS_KEY))
    try:
        before = metric_samples(gw.url)
        client = gw.openai()
        raw = client.completions.with_raw_response.create(model="tiny", prompt="hello",
                                                          max_tokens=2)
        assert raw.parse().usage.prompt_tokens_details.cached_tokens == 0
        assert raw.headers["x-kvmesh-cached-tokens"] == "0"
        chunks = list(client.completions.create(model="tiny", prompt="hello", max_tokens=2,
                                                stream=True,
                                                stream_options={"include_usage": True}))
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 0
        client.completions.create(model="tiny", prompt="hello", max_tokens=2,
                                  extra_body={"cache_salt": "team-1"})  # its own salt: told
        after = metric_samples(gw.url)
        shared = "kvmesh_gateway_shared_cache_cached_tokens_total"
        assert metric_delta(before, after, shared) == 2 * W1_CACHED
        assert metric_delta(before, after, "kvmesh_gateway_cached_tokens_total") == W1_CACHED
    finally:
        gw.stop()


def test_head_metrics_and_model_paths(stack: Stack) -> None:
    url = stack.gateway.url
    head = urllib.request.Request(f"{url}/metrics", method="HEAD",
                                  headers={"authorization": f"Bearer {METRICS_KEY}"})
    with urllib.request.urlopen(head, timeout=5) as resp:
        assert resp.status == 200 and resp.read() == b""
        assert resp.headers["content-type"].startswith("text/plain")
    assert _status(urllib.request.Request(f"{url}/metrics", method="HEAD")) == 401
    before = metric_samples(url)
    stack.gateway.openai().models.retrieve("tiny")
    after = metric_samples(url)  # one label for every model id: a scanner cannot grow the set
    assert metric_delta(before, after, "kvmesh_gateway_requests_total",
                        path="/v1/models/{id}", status="200") == 1
