"""docs/operations.md lists every flag of every serving command (it is the operator's page)."""
from pathlib import Path

import typer
from typer.core import TyperOption

from client.cli import app

COMMANDS = ("up", "service", "worker", "worker-token", "worker-access-token", "gateway",
            "route", "generate", "stats", "pin", "quota set", "quota show", "demo",
            "bridge vllm")


def test_operations_doc_lists_every_flag():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    group = typer.main.get_command(app)
    missing = []
    for name in COMMANDS:
        section = doc.split(f"### `kvmesh {name}`", 1)
        assert len(section) == 2, f"no section for kvmesh {name}"
        body = section[1].split("\n### ", 1)[0]
        cmd = group
        for part in name.split():  # "bridge vllm": a verb of a group
            cmd = cmd.get_command(None, part)
        for param in cmd.params:
            if isinstance(param, TyperOption) and param.name != "help":
                if f"`{param.opts[0]}`" not in body:
                    missing.append(f"kvmesh {name} {param.opts[0]}")
    assert not missing, f"add to docs/operations.md: {missing}"
