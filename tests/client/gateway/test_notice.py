"""``kvmesh gateway`` says once at start how it isolates callers, what to do to share a
cache, and who the tenant of the concurrency cap is."""
from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from client.gateway import register


def start(monkeypatch: pytest.MonkeyPatch, *flags: str) -> str:
    """The output of ``kvmesh gateway FLAGS`` up to the point where it would listen."""
    import uvicorn

    served: list[object] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.append(app))
    app = typer.Typer()
    register(app)
    app.command("other")(lambda: None)  # two verbs, so typer keeps the verb names
    result = CliRunner().invoke(app, ["gateway", *flags])
    assert result.exit_code == 0, result.output
    assert len(served) == 1
    return result.output


def test_the_default_says_each_request_is_isolated_and_how_to_share(
        monkeypatch: pytest.MonkeyPatch) -> None:
    out = start(monkeypatch)
    assert out.count("cache isolation per request") == 1  # once
    for remedy in ("--tenant-keys", "cache_salt", "--insecure-shared-cache",
                   "x-kvmesh-cache-scope"):
        assert remedy in out
    assert "--max-concurrent-per-tenant 32" in out
    assert "the tenant is the client's IP address" in out


def test_tenant_keys_say_each_tenant_shares_its_own_cache(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("sk-1 acme\nsk-2 globex\n")
    keys.chmod(0o600)
    out = start(monkeypatch, "--tenant-keys", str(keys), "--salt-secret", "s",
                "--max-concurrent-per-tenant", "40")
    assert "cache isolation per tenant (--tenant-keys, 2 tenant(s))" in out
    assert "--max-concurrent-per-tenant 40" in out and "per API key's tenant" in out
    assert "sk-1" not in out  # no key is ever printed
    assert "IP address" not in out


def test_the_shared_cache_warns_once_and_names_the_operators_metric(
        monkeypatch: pytest.MonkeyPatch) -> None:
    out = start(monkeypatch, "--insecure-shared-cache")
    assert out.count("--insecure-shared-cache: requests without cache_salt share one") == 1
    assert "timing oracle" in out
    assert "kvmesh_gateway_shared_cache_cached_tokens_total" in out


def test_fair_admission_is_announced_only_when_bounded(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    assert "--max-concurrent " not in start(monkeypatch)
    out = start(monkeypatch, "--max-concurrent", "16", "--max-queue-wait", "5")
    assert "--max-concurrent 16: above it requests wait (at most 5 s" in out
    assert "all requests are one tenant" in out
    keys = tmp_path / "keys.txt"
    keys.write_text("k1 acme\nk2 globex\n")
    keys.chmod(0o600)
    out = start(monkeypatch, "--tenant-keys", str(keys), "--salt-secret", "s",
                "--max-concurrent", "16", "--tenant-weights", "acme=2")
    assert "weighted fair shares (acme=2; any other tenant 1), per API key's tenant" in out
