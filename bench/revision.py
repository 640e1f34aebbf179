"""Another git revision's kvmesh, to run under this bench: before and after in one run.

:func:`source_tree` extracts ``REV`` (``git archive``) for a cluster's children to run from,
while the bench and client stay this tree's; :func:`service_flags` says which service flags
REV knows. The C hash extension is reused or rebuilt, else a warning says hashing runs in Python.

See docs/architecture.md#end-to-end-and-serving-benches.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

_FLAG = re.compile(r"--[a-z][a-z0-9-]*")


def repo_root() -> Path:
    """The git checkout this bench runs from; ``RuntimeError`` when it is not one."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "--show-toplevel"],
                             check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise RuntimeError(f"--against needs kvmesh run from a git checkout ({here}): {e}"
                           ) from None
    return Path(out.strip())


def extract(rev: str, into: Path, repo: Path) -> None:
    """The whole tree of ``rev`` (``git archive``) under ``into``; ``ValueError`` for a
    revision git does not know."""
    res = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", rev],
                         capture_output=True)
    if res.returncode:
        raise ValueError(f"git archive {rev}: {res.stderr.decode(errors='replace').strip()}")
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(res.stdout)) as tar:
        tar.extractall(into, filter="data")


def _install_chain(tree: Path) -> None:
    """Give ``tree`` the compiled block-hash chain (see the module docstring)."""
    spec = importlib.util.find_spec("kvmesh._chain")
    ours = Path(spec.origin) if spec is not None and spec.origin else None
    source = tree / "kvmesh" / "_chain.c"
    if not source.exists():
        return  # a revision from before the C path
    here = repo_root() / "kvmesh" / "_chain.c"
    if ours is not None and here.exists() and here.read_bytes() == source.read_bytes():
        shutil.copy2(ours, tree / "kvmesh" / ours.name)
        return
    res = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                         cwd=tree, capture_output=True, text=True)
    if res.returncode:
        print(f"warning: could not build kvmesh._chain of the revision (its block hashes run "
              f"in Python, slower):\n{res.stderr[-2000:]}", file=sys.stderr)


@contextlib.contextmanager
def source_tree(rev: str) -> Iterator[Path]:
    """``rev``'s tree, ready to run (its C hash chain built), removed on exit."""
    repo = repo_root()
    with tempfile.TemporaryDirectory(prefix="kvmesh-rev-") as tmp:
        tree = Path(tmp) / "src"
        extract(rev, tree, repo)
        _install_chain(tree)
        yield tree


def child_env(tree: Path) -> dict[str, str]:
    """The environment of a child process that must import ``tree``'s packages."""
    return {**os.environ, "PYTHONPATH": str(tree)}


def service_flags(tree: Path) -> frozenset[str]:
    """The flags ``kvmesh service`` of ``tree`` takes (its ``--help``, run from ``tree``)."""
    env = {**child_env(tree), "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb"}
    out = subprocess.run([sys.executable, "-m", "service", "--help"], cwd=tree, env=env,
                         check=True, capture_output=True, text=True).stdout
    return frozenset(_FLAG.findall(out))
