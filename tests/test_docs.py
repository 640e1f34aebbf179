"""The project's maps stay true: every pointer into the docs lands on a heading, and every path
the README's layout names exists.

Module docstrings end with ``See docs/architecture.md#<anchor>``; the docs link to each other's
anchors. GitHub derives an anchor from a heading: lower case, punctuation but ``-`` and ``_``
dropped, spaces to ``-``, and ``-1``, ``-2`` ... for repeats.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("kvmesh", "worker", "service", "client", "bridge", "deploy", "bench")
POINTER = re.compile(r"(docs/[\w.-]+\.md)#([\w-]+)")
LINK = re.compile(r"\]\(([\w./-]*\.md)?#([\w-]+)\)")


def anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in doc.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_every_docstring_pointer_lands_on_a_heading() -> None:
    broken = []
    count = 0
    for pkg in SOURCES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for doc, anchor in POINTER.findall(path.read_text()):
                count += 1
                if anchor not in anchors(ROOT / doc):
                    broken.append(f"{path.relative_to(ROOT)}: {doc}#{anchor}")
    assert count > 100  # the docstrings do point into the docs
    assert broken == []


def test_every_link_between_docs_lands_on_a_heading() -> None:
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target, anchor in LINK.findall(page.read_text()):
            doc = (page.parent / target).resolve() if target else page
            if anchor not in anchors(doc):
                broken.append(f"{page.relative_to(ROOT)}: {target}#{anchor}")
    assert broken == []


def test_the_readme_layout_names_paths_that_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Layout", 1)[1].split("```", 2)[1]
    missing, checked = [], 0
    parents: list[str] = []  # the directory each indentation level is in
    for line in block.splitlines():
        m = re.match(r"( *)([\w./-]+/|[\w.-]+\.(?:py|c|proto|lua))\s", line + " ")
        if not m:
            continue
        depth = len(m.group(1)) // 2
        parents = parents[:depth]
        for name in m.group(2).replace(",", " ").split():
            path = ROOT.joinpath(*parents, name)
            checked += 1
            if not path.exists():
                missing.append(str(path.relative_to(ROOT)))
        if m.group(2).endswith("/"):
            parents.append(m.group(2))
    assert checked > 20 and missing == []


def _resolves(parts: list[str]) -> bool:
    """A dotted name is a module of this tree and attributes of it; a package takes one
    attribute at most (what its ``__init__`` exports)."""
    for n in range(len(parts), 0, -1):
        path = ROOT.joinpath(*parts[:n])
        if path.with_suffix(".py").exists() or path.with_suffix(".c").exists():
            return True  # (a C extension's source: kvmesh/_chain.c)
        if (path / "__init__.py").exists():
            return n == len(parts) or (n == len(parts) - 1
                                       and parts[-1] in (path / "__init__.py").read_text())
    return False


def test_the_docs_name_files_and_modules_that_exist() -> None:
    """A path or module the docs name in backticks is one of this tree's (a module may be
    followed by its attributes: ``kvmesh.contract.TIERS``)."""
    tops = ("kvmesh", "worker", "service", "client", "bridge", "deploy", "bench", "tests",
            "tools", "proto", "docs")
    missing, checked = [], 0
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for name in re.findall(r"`([\w./-]+)`", page.read_text()):
            if "/" in name and name.split("/")[0] in tops and re.search(
                    r"\.(py|lua|c|proto|md)$|/$", name):
                checked += 1
                if not (ROOT / name).exists():
                    missing.append(f"{page.name}: {name}")
            elif re.fullmatch(r"(kvmesh|worker|service|client|bridge|deploy|bench)(\.\w+)+",
                              name) and not re.search(r"\.(crt|key|pem|json|toml|png)$", name):
                checked += 1
                if not _resolves(name.split(".")):
                    missing.append(f"{page.name}: {name}")
    assert checked > 200 and missing == []
