"""The `kvmesh` command line."""
import typer

app = typer.Typer(no_args_is_help=True, help="kvmesh: distributed KV-cache prefix routing.")
bench = typer.Typer(no_args_is_help=True, help="Benchmarks that compare side by side.")
app.add_typer(bench, name="bench")
