"""``kvmesh gateway``'s CLI: the verb, its flags, no torch, the tiny model's context."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner


def test_cli_registers_gateway_and_rejects_bad_flags(tmp_path: Path) -> None:
    import typer

    from client.gateway import register

    app = typer.Typer()
    register(app)
    app.command("other")(lambda: None)  # two verbs, so typer keeps the verb names
    runner = CliRunner()
    result = runner.invoke(app, ["gateway", "--help"])
    assert result.exit_code == 0 and "--tenant-keys" in result.output
    missing = tmp_path / "nope.txt"
    result = runner.invoke(app, ["gateway", "--tenant-keys", str(missing)])
    assert result.exit_code == 2
    (tmp_path / "keys.txt").write_text("only-a-key\n")
    result = runner.invoke(app, ["gateway", "--tenant-keys", str(tmp_path / "keys.txt")])
    assert result.exit_code == 2
    assert "line 1" in result.output


def test_gateway_modules_do_not_import_torch() -> None:
    code = ("import sys, client.gateway.app, client.gateway.cli; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_tiny_context_matches_the_workers_model() -> None:
    """The gateway checks prompt lengths against the tiny model's context without importing
    the worker (torch); the two numbers must agree."""
    from client.gateway.cli import model_context
    from worker.model.loader import TINY_CONFIG

    assert model_context("tiny") == TINY_CONFIG["max_position_embeddings"]


def test_fair_admission_flags_reach_the_config_and_bad_ones_exit_2(tmp_path: Path,
                                                                   capsys) -> None:
    import typer

    from client.gateway import register
    from client.gateway.cli import build_config

    keys = tmp_path / "keys.txt"
    keys.write_text("k1 acme\nk2 globex\n")
    keys.chmod(0o600)
    config = build_config("127.0.0.1:1", tenant_keys=keys, salt_secret="s",
                          limits={"max_total": 16, "max_wait_s": 2.5},
                          tenant_weights=["acme=2", "globex=1,nobody=3"])
    assert (config.max_total, config.max_wait_s) == (16, 2.5)
    assert config.tenant_weights == {"acme": 2.0, "globex": 1.0, "nobody": 3.0}
    assert "nobody, which no API key" in capsys.readouterr().err
    app = typer.Typer()
    register(app)
    app.command("other")(lambda: None)
    runner = CliRunner()
    for flags, words in ((["--tenant-weights", "a=0"], "weight > 0"),
                         (["--max-concurrent", "4", "--max-batch-prompts", "8"],
                          "must not exceed --max-concurrent"),
                         (["--max-concurrent", "-1"], "--max-concurrent must be")):
        result = runner.invoke(app, ["gateway", *flags])
        assert result.exit_code == 2 and words in result.output, result.output
