"""``python -m service [--port 50051] ...``: the ``kvmesh service`` command on its own."""
from __future__ import annotations

import typer

from kvmesh.ops.lifecycle import die_with_parent
from service.cli import register_service

app = typer.Typer(add_completion=False, help="kvmesh metadata service.")
register_service(app)

if __name__ == "__main__":
    die_with_parent()
    app()
