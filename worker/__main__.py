"""`python -m worker ...` is `kvmesh worker ...`."""
import typer

from kvmesh.ops.lifecycle import die_with_parent
from worker.cli import register

die_with_parent()
app = typer.Typer(add_completion=False)
register(app)
app()
