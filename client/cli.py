"""The `kvmesh` command line.

Each verb lives next to what it drives (``worker/cli.py``, ``service/cli.py``, ``bench/*.py``
...) and exposes ``register(app)``; this file only wires them, so adding a verb never touches
another verb's module. Heavy imports (torch, grpc servers) stay inside the command bodies so
``kvmesh --help`` is instant.
"""
from __future__ import annotations

import importlib
import importlib.util

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="kvmesh: distributed KV-cache index and prefix-aware routing.")
bench = typer.Typer(no_args_is_help=True, help="Benchmarks that compare side by side in one run.")
app.add_typer(bench, name="bench")

# (module, typer group): module.register(group) adds its verbs. A module that is not there
# (a partial install) is skipped; one that fails to import is an error, not hidden.
VERBS = [
    ("client.commands", app),      # route, generate, stats
    ("service.cli", app),          # service
    ("worker.cli", app),           # worker
    ("deploy.cli", app),           # up, demo
    ("client.gateway", app),       # gateway
    ("bench.hashing", bench),
    ("bench.kvcache", bench),
    ("bench.worker", bench),
    ("bench.route", bench),
    ("bench.replay", bench),
    ("bench.index", bench),
    ("bench.e2e", bench),
    ("bench.soak", bench),
    ("deploy.ray.bench", bench),   # bench serve (Ray Serve routers side by side)
]

for _module, _group in VERBS:
    if importlib.util.find_spec(_module) is not None:
        importlib.import_module(_module).register(_group)
