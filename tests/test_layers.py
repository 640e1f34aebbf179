"""Layers only point down: every module's imports, read with ``ast``, respect the floors.

``kvmesh/`` (the contract) <- ``worker/``, ``service/``, ``client/``, ``bridge/`` (each imports
only ``kvmesh/`` and itself) <- ``deploy/`` (starts them) <- ``bench/`` (measures them, demo
included). Imports inside functions count too: a lazy import is still a dependency. Third-party
and standard-library imports are not checked.

The one exception: the CLI aggregator ``client/cli.py`` names every verb of every floor, and
may import them, but ONLY lazily (inside a function). It imports by module name through
``importlib``, which ``ast`` cannot see, so the rule below also keeps it honest if it is ever
rewritten with plain imports at module level.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOORS = ("kvmesh", "worker", "service", "client", "bridge", "deploy", "bench")
ALLOWED = {
    "kvmesh": {"kvmesh"},
    "worker": {"kvmesh", "worker"},
    "service": {"kvmesh", "service"},
    "client": {"kvmesh", "client"},
    "bridge": {"kvmesh", "bridge"},
    "deploy": {"kvmesh", "worker", "service", "client", "bridge", "deploy"},
    "bench": {"kvmesh", "worker", "service", "client", "bridge", "deploy", "bench"},
}
# (module path, imported top package): imports allowed only inside a function, never at
# module import time. Keep this list short and say why for each.
LAZY_ONLY = {
    # the `kvmesh` CLI aggregator names every verb and loads each one on use
    **{("client/cli.py", floor): "CLI aggregator" for floor in FLOORS},
}
# (module path, imported top package): sideways imports with a reason that outlives this
# test. Empty: none is needed today.
ALLOWLIST: dict[tuple[str, str], str] = {}


def _imports(tree: ast.Module, package: str) -> list[tuple[int, str, bool]]:
    """(line, top-level package, inside a function) of every import in ``tree``."""
    found: list[tuple[int, str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef
                                               | ast.Lambda)
            if isinstance(child, ast.Import):
                found.extend((child.lineno, a.name.split(".")[0], in_function)
                             for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                # a relative import stays inside its own package
                top = package if child.level else (child.module or "").split(".")[0]
                found.append((child.lineno, top, in_function))
            visit(child, nested)

    visit(tree, False)
    return found


def violations() -> list[str]:
    out = []
    for floor in FLOORS:
        for path in sorted((ROOT / floor).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            tree = ast.parse(path.read_text(), filename=rel)
            for line, top, lazy in _imports(tree, floor):
                if top not in FLOORS or top in ALLOWED[floor] or (rel, top) in ALLOWLIST:
                    continue
                if lazy and (rel, top) in LAZY_ONLY:
                    continue
                where = "inside a function" if lazy else "at module level"
                out.append(f"{rel}:{line}: {floor}/ imports {top}/ ({where})")
    return out


def test_layers_only_point_down() -> None:
    found = violations()
    assert not found, "imports that point up or sideways:\n" + "\n".join(found)


def test_the_reader_sees_lazy_and_relative_imports() -> None:
    tree = ast.parse("import os\nfrom . import x\ndef f():\n    from bench.e2e import run\n")
    assert _imports(tree, "client") == [(1, "os", False), (2, "client", False),
                                        (4, "bench", True)]


def test_the_cli_aggregator_imports_no_verb_until_it_runs() -> None:
    import subprocess
    import sys

    probe = ("import sys, client.cli; print(sorted({m.split('.')[0] for m in sys.modules}"
             " & {'worker', 'service', 'deploy', 'bench'}))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"


# Inside ``kvmesh/``, its parts point one way too: the contract and the generated stubs at the
# bottom, the index link and the OpenAI surface at the top, nothing importing the link.
# part -> the parts it may import (``_chain`` is the C fast path of hashing).
KVMESH_PARTS = {
    "v1": set(),
    "_chain": set(),
    "contract": {"v1"},
    "hashing": {"contract", "_chain"},
    "ops": {"contract"},
    "tier_figures": {"contract", "v1"},
    "rpc": {"contract", "ops", "v1"},
    "openai": {"contract", "ops"},
    "events": {"contract", "hashing", "ops", "v1", "_chain"},
    "link": {"contract", "hashing", "ops", "rpc", "events", "v1"},
    "transfer": {"ops"},
    "quota": {"contract", "v1"},
}


def _kvmesh_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "kvmesh" and len(parts) > 1 else None


def kvmesh_violations() -> list[str]:
    out = []
    for path in sorted((ROOT / "kvmesh").rglob("*.py")):
        rel = path.relative_to(ROOT)
        part = _kvmesh_part(".".join(rel.with_suffix("").parts))
        if part is None or part == "__init__":
            continue
        if part not in KVMESH_PARTS:
            out.append(f"{rel.as_posix()}: kvmesh/{part} is not in KVMESH_PARTS: place it")
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(rel))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = ([f"kvmesh.{a.name}" for a in node.names] if node.module == "kvmesh"
                         else [node.module])
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                other = _kvmesh_part(name)
                if other and other != part and other not in KVMESH_PARTS[part]:
                    out.append(f"{rel.as_posix()}:{node.lineno}: kvmesh/{part} imports "
                               f"kvmesh/{other}")
    return out


def test_kvmesh_parts_only_point_down() -> None:
    found = kvmesh_violations()
    assert not found, "kvmesh/ parts importing up or sideways:\n" + "\n".join(found)
