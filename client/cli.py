"""The `kvmesh` command line: names every verb, imports each one only when it is used.

Each verb lives next to what it drives (``worker/cli.py``, ``service/cli.py``, ``bench/*.py``
...) and exposes ``register(group)``. This file only names them: a verb's module is imported
when that verb is invoked (or listed by ``--help``), never when this module is, so ``client``
does not import ``worker``, ``service``, ``deploy`` or ``bench`` (the layer rule of
``tests/test_layers.py``; this aggregator is its one exception, for these lazy imports only).
Heavy imports (torch, grpc servers) stay inside the command bodies.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys

import click
import typer
from typer import rich_utils
from typer.core import TyperGroup

# Help read by a program (a pipe, a script, a docs test) has no terminal to fit: rich would
# lay it out in 80 columns and cut long option names (`--default-tenant…`), so what a
# script greps for would be missing. Without a terminal (and no TERMINAL_WIDTH), give it room.
if rich_utils.MAX_WIDTH is None and not sys.stdout.isatty():
    rich_utils.MAX_WIDTH = 120

# verb -> the module whose register(group) adds it. A module that is not there (a partial
# install) is not listed; one that fails to import is an error, not hidden.
VERBS = {
    "route": "client.commands", "generate": "client.commands", "stats": "client.commands",
    "pin": "client.commands", "quota": "client.quota_cmds",
    "service": "service.cli", "worker-token": "service.cli",
    "worker-access-token": "service.cli",
    "worker": "worker.cli",
    "up": "deploy.cli",
    "gateway": "client.gateway",
    "bridge": "bridge.cli",
    "demo": "bench.demo",
}
BENCH_VERBS = {
    "hashing": "bench.hashing", "kvcache": "bench.kvcache", "worker": "bench.worker",
    "route": "bench.route", "replay": "bench.replay", "index": "bench.index",
    "e2e": "bench.e2e", "soak": "bench.soak", "tiers": "bench.tiers",
    "bridge": "bench.bridge",
    "fleet": "bench.fleet",  # simulated workers + routes over one Redis or a cluster
    "serve": "bench.ray_serve",  # Ray Serve routers side by side
    "trace": "bench.traces",  # synthetic Mooncake-format traces for replay
    "transfer": "bench.transfer",  # the peer-KV data plane's transports, fetch vs recompute
    "tenants": "bench.tenants",  # a flooding tenant without and with quotas
}


class _LazyGroup(TyperGroup):
    """A group whose verbs (``verbs``: name -> module) load on first use."""

    verbs: dict[str, str] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        present = [n for n, m in self.verbs.items() if _installed(m)]
        return present + [n for n in super().list_commands(ctx) if n not in self.verbs]

    def get_command(self, ctx: click.Context | None, cmd_name: str) -> click.Command | None:
        module = self.verbs.get(cmd_name)
        if cmd_name not in self.commands and module is not None:
            scratch = typer.Typer()
            importlib.import_module(module).register(scratch)
            for name, cmd in typer.main.get_group(scratch).commands.items():
                self.commands.setdefault(name, cmd)
        return super().get_command(ctx, cmd_name)  # type: ignore[arg-type]


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is not installed either
        return False


def _lazy(verbs: dict[str, str]) -> type[TyperGroup]:
    return type("LazyGroup", (_LazyGroup,), {"verbs": verbs})


app = typer.Typer(cls=_lazy(VERBS), no_args_is_help=True, add_completion=False,
                  help="kvmesh: distributed KV-cache index and prefix-aware routing.")
bench = typer.Typer(cls=_lazy(BENCH_VERBS), no_args_is_help=True,
                    help="Benchmarks that compare side by side in one run.")
app.add_typer(bench, name="bench")


@bench.callback()
def _bench_runs(ctx: typer.Context) -> None:
    """Every bench run stops within the deadline on SIGTERM/SIGINT and leaves no process
    (deploy.stopping.guard_command: benches start clusters without a stop loop of their own)."""
    from deploy.stopping import guard_command

    guard = guard_command()
    if guard is not None:  # run in-process (a test): the process is put back afterwards
        ctx.call_on_close(guard.uninstall)
