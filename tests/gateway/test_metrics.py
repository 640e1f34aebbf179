"""``GET /metrics`` on the gateway's API port (for the metrics key only) and on its own
listener: requests by status, TTFT, cached tokens."""
from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from client.gateway.app import GatewayConfig
from client.gateway.metrics import GatewayMetrics
from tests.gateway.conftest import METRICS_KEY, W1_CACHED, LiveGateway, Stack


def _samples(url: str, key: str | None = METRICS_KEY
             ) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    with urllib.request.urlopen(urllib.request.Request(f"{url}/metrics", headers=headers),
                                timeout=5) as resp:
        assert resp.headers["content-type"].startswith("text/plain")
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _delta(before: dict, after: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_metrics_count_requests_ttft_and_cached_tokens(stack: Stack) -> None:
    url = stack.gateway.url
    before = _samples(url)
    client = stack.gateway.openai()
    client.completions.create(model="tiny", prompt="hello", max_tokens=2)
    stream = client.completions.create(model="tiny", prompt="hello", max_tokens=2,
                                       stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == "de"
    try:
        urllib.request.urlopen(f"{url}/nothing-here", timeout=5)
    except urllib.error.HTTPError as err:
        assert err.code == 404
    after = _samples(url)
    path = "/v1/completions"
    assert _delta(before, after, "kvmesh_gateway_requests_total", path=path, status="200") == 2
    assert _delta(before, after, "kvmesh_gateway_requests_total", path="other",
                  status="404") == 1
    assert _delta(before, after, "kvmesh_gateway_ttft_seconds_count") == 2
    assert _delta(before, after, "kvmesh_gateway_ttft_seconds_sum") > 0
    assert _delta(before, after, "kvmesh_gateway_prompt_tokens_total") == 2 * len("hello")
    assert _delta(before, after, "kvmesh_gateway_cached_tokens_total") == 2 * W1_CACHED


def test_metrics_count_refused_requests(stack: Stack) -> None:
    url = stack.tenant_gateway.url
    before = _samples(url)
    req = urllib.request.Request(f"{url}/v1/completions", data=b"{}", method="POST",
                                 headers={"content-type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=5)
    except urllib.error.HTTPError as err:
        assert err.code == 401
    after = _samples(url)
    assert _delta(before, after, "kvmesh_gateway_requests_total", path="/v1/completions",
                  status="401") == 1
    assert _delta(before, after, "kvmesh_gateway_ttft_seconds_count") == 0


def _status(url: str, authorization: str | None = None) -> int:
    headers = {"authorization": authorization} if authorization else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5):
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
    assert _samples(f"http://127.0.0.1:{port}", key=None)[
        ("kvmesh_gateway_prompt_tokens_total", ())] == 5
