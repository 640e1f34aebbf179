"""``GET /metrics`` on the gateway's own port: requests by status, TTFT, cached tokens."""
from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.conftest import W1_CACHED, Stack


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
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
