"""`kvmesh worker`'s flags reach ``WorkerOptions``: the peer-fetch switch."""
from __future__ import annotations

import pytest
import typer

from worker.cli import options_of, register
from worker.main import WorkerOptions


def parsed(args: list[str]) -> WorkerOptions:
    """The options ``kvmesh worker ARGS`` would run with (nothing started)."""
    app = typer.Typer()
    register(app)
    app.command("unused")(lambda: None)  # a group: the verb is named, as in `kvmesh worker`
    ctx = typer.main.get_command(app).commands["worker"].make_context("worker", list(args))
    return options_of(ctx.params)


@pytest.mark.parametrize(("args", "on"), [([], True), (["--peer-fetch"], True),
                                          (["--no-peer-fetch"], False)])
def test_peer_fetch_is_on_unless_switched_off(args, on):
    assert parsed(args).peer_fetch is on
    assert WorkerOptions().peer_fetch is True
