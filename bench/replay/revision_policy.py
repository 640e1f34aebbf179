"""The ``kvmesh`` policy as it was at a git revision, beside the live one (``--against REV``).

REV's policy modules are read with ``git show`` into a private package (imports rewritten by
AST), so the live ``service.policy`` is never touched; :class:`PolicyAtRevision` adapts it to
the live interface. The bench around the policy stays the live code.

See docs/architecture.md#replay-and-simulation.
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import random
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import service
from service.policy import Policy, Ranked, WorkerView

# Modules REV's policy brings with it (as ``service/<name>.py`` or ``service/<name>/``).
OWNED = ("policy", "config", "credits")

_loaded: dict[str, ModuleType] = {}  # sha -> REV's private ``policy`` module


def repository() -> Path:
    """The git work tree the live ``service`` package was imported from."""
    here = Path(service.__file__).resolve().parent
    return Path(_git(here, "rev-parse", "--show-toplevel").strip())


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise ValueError(f"git {' '.join(args)}: {done.stderr.strip() or 'failed'}")
    return done.stdout


def resolve(rev: str, repo: Path | None = None) -> str:
    """The full commit id of ``rev``; raises ``ValueError`` if it names no commit."""
    repo = repo or repository()
    try:
        return _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip()
    except ValueError:
        raise ValueError(f"{rev!r} names no commit of {repo}") from None


class _Rename(ast.NodeTransformer):
    """Rewrites imports of the owned ``service.<name>`` modules to the private package."""

    def __init__(self, package: str) -> None:
        self.package = package
        self.gone: set[str] = set()  # ``kvmesh`` modules REV imports that the live tree lacks

    def _moved(self, module: str) -> str | None:
        """REV's own copy of a shared ``kvmesh`` module the live tree no longer has."""
        if not module.startswith("kvmesh.") or importlib.util.find_spec(module) is not None:
            return None
        self.gone.add(module)
        return f"{self.package}._kvmesh.{module[len('kvmesh.'):]}"

    def _private(self, module: str) -> str | None:
        for name in OWNED:
            live = f"service.{name}"
            if module == live or module.startswith(live + "."):
                return self.package + module[len("service"):]
        return None

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.ImportFrom:
        if node.level == 0 and node.module is not None:
            if node.module == "service" and all(a.name in OWNED for a in node.names):
                node.module = self.package
            else:
                node.module = (self._private(node.module) or self._moved(node.module)
                               or node.module)
        return node

    def visit_Import(self, node: ast.Import) -> ast.Import:
        for alias in node.names:
            private = self._private(alias.name)
            if private is not None and alias.asname is None:
                raise ValueError(f"`import {alias.name}` binds the live `service`; REV's "
                                 "code must import it `as` a name or `from` it")
            alias.name = private or alias.name
        return node


def load(rev: str, repo: Path | None = None) -> ModuleType:
    """REV's ``service.policy`` (module or package), imported privately (see the module
    docstring); memoized per commit."""
    repo = repo or repository()
    sha = resolve(rev, repo)
    if sha in _loaded:
        return _loaded[sha]
    package = f"_kvmesh_at_{sha[:12]}"
    paths = [p for p in _git(repo, "ls-tree", "-r", "--name-only", sha, "--",
                             *(f"service/{n}.py" for n in OWNED),
                             *(f"service/{n}" for n in OWNED)).splitlines()
             if p.endswith(".py")]
    if not any(p.startswith("service/policy") for p in paths):
        raise ValueError(f"{rev} ({sha[:12]}) has no service/policy.py or service/policy/")
    rename = _Rename(package)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / package
        root.mkdir()
        (root / "__init__.py").write_text('"""kvmesh code of one git revision."""\n')
        for path in paths:
            tree = rename.visit(ast.parse(_git(repo, "show", f"{sha}:{path}"), path))
            dest = root / Path(path).relative_to("service")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(ast.unparse(ast.fix_missing_locations(tree)) + "\n")
        done: set[str] = set()
        while rename.gone - done:  # REV's shared modules since moved or merged, vendored
            module = min(rename.gone - done)
            done.add(module)
            path = module.replace(".", "/") + ".py"
            tree = rename.visit(ast.parse(_git(repo, "show", f"{sha}:{path}"), path))
            dest = root / "_kvmesh" / Path(path).relative_to("kvmesh")
            dest.parent.mkdir(parents=True, exist_ok=True)
            (root / "_kvmesh" / "__init__.py").touch()
            dest.write_text(ast.unparse(ast.fix_missing_locations(tree)) + "\n")
            paths.append(f"service/_kvmesh/{dest.relative_to(root / '_kvmesh')}")
        sys.path.insert(0, tmp)
        try:
            # every module now: the files go with the directory
            for path in sorted(paths):
                rel = Path(path).relative_to("service").with_suffix("")
                parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
                importlib.import_module(".".join((package, *parts)))
        finally:
            sys.path.remove(tmp)
            importlib.invalidate_caches()
    module = sys.modules[f"{package}.policy"]
    _loaded[sha] = module
    return module


class PolicyAtRevision(Policy):
    """REV's ``kvmesh`` policy behind the live ``Policy`` interface (module docstring).

    ``overrides`` replace fields of REV's own default ``CostWeights``; one REV's weights do
    not have raises ``ValueError``."""

    name = "kvmesh"

    def __init__(self, rev: str, overrides: dict[str, float] | None = None,
                 repo: Path | None = None) -> None:
        module = load(rev, repo)
        self.rev, self.sha = rev, resolve(rev, repo)
        config = sys.modules[module.__name__.rpartition(".")[0] + ".config"]
        try:
            weights = dataclasses.replace(config.CostWeights(), **(overrides or {}))
        except TypeError as e:
            raise ValueError(f"{rev}'s CostWeights: {e}") from None
        self.inner = module.make_policies(weights)[self.name]
        self._view = getattr(module, "WorkerView", WorkerView)
        ours = {f.name for f in dataclasses.fields(WorkerView)}
        theirs = {f.name for f in dataclasses.fields(self._view)}
        if self._view is WorkerView or not theirs <= ours:
            self._view = None  # hand REV the live views (a superset of what it reads)
        self._fields = sorted(theirs)
        self._takes_key = "key" in inspect.signature(self.inner.rank).parameters

    def rank(self, prompt_tokens: int, workers: Sequence[WorkerView],
             rng: random.Random, key: bytes = b"") -> list[Ranked]:
        views = list(workers)
        if self._view is not None:
            theirs = [self._view(**{f: getattr(v, f) for f in self._fields}) for v in views]
        else:
            theirs = views
        back = {id(t): v for t, v in zip(theirs, views, strict=True)}
        extra = {"key": key} if self._takes_key else {}
        ranked = self.inner.rank(prompt_tokens, theirs, rng, **extra)
        return [Ranked(back[id(r.view)], float(r.cost), r.matched_tokens) for r in ranked]
