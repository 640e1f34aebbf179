"""``kvmesh up``'s flags that only one backend can honour: refused on the other with one
``error:`` line and exit 2, before anything starts; honoured ones reach the backend."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from client.cli import app


def test_data_host_is_refused_on_the_local_backend() -> None:
    out = CliRunner().invoke(app, ["up", "--data-host", "10.0.0.5"])
    assert out.exit_code == 2
    assert "--data-host needs --backend ray" in out.output


def test_data_host_reaches_the_ray_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    import typer

    import deploy.cli
    import deploy.ray.cli

    def exit_now(code: int):  # the real one ends the process (os._exit)
        raise typer.Exit(code)

    seen: dict = {}
    monkeypatch.setattr(deploy.ray.cli, "run_up", lambda **kw: seen.update(kw))
    monkeypatch.setattr(deploy.cli, "_exit_now", exit_now)
    out = CliRunner().invoke(app, ["up", "--backend", "ray", "--data-host", "10.0.0.5"])
    assert out.exit_code == 0, out.output
    assert seen["data_host"] == "10.0.0.5"
    spec_fields = deploy.ray.cli.RaySpec.__dataclass_fields__
    assert "data_host" in spec_fields
