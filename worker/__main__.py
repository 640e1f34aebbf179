"""`python -m worker ...` is `kvmesh worker ...`."""
import typer

from worker.cli import register

app = typer.Typer(add_completion=False)
register(app)
app()
