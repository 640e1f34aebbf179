"""The Lua of the redis backends: one file per script in ``lua/``, loaded here and only here.

A file is a ``--`` header (not sent), then the body with ``--@include NAME`` (the fragment
``_NAME.lua``) and ``${NAME}`` (:data:`CONSTANTS`) expanded; an unknown name is an error.
A script's text is fixed at import, so its SHA is the same on every replica of one version.

See docs/architecture.md#the-redis-layout-serviceindexredis.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from service.index.redis import keys, resp

__all__ = ["CONSTANTS", "LUA_DIR", "PEND_STALE_MS", "RawScript", "header", "names",
           "raw", "text"]

LUA_DIR = Path(__file__).with_name("lua")
PEND_STALE_MS = 10_000  # a heartbeat asks for a snapshot when pend is older than this
CONSTANTS = {"CTL": keys.CTL, "ENTRY_BYTES": str(keys.ENTRY_BYTES),
             "MAX_HANDLE": str(keys.MAX_HANDLE),
             "PEND_STALE_MS": str(PEND_STALE_MS)}
_INCLUDE = re.compile(r"^--@include (\w+)\n", re.MULTILINE)
_CONSTANT = re.compile(r"\$\{(\w*)\}")


def names() -> list[str]:
    """Every script (fragments left out), sorted."""
    return sorted(p.stem for p in LUA_DIR.glob("*.lua") if not p.stem.startswith("_"))


def _split(name: str) -> tuple[str, str]:
    """(header, body) of ``lua/<name>.lua``."""
    source = (LUA_DIR / f"{name}.lua").read_text()
    head, sep, body = source.partition("\n\n")
    if not sep or not all(line.startswith("--") for line in head.splitlines()):
        raise ValueError(f"{name}.lua: no header of '--' lines ended by an empty line")
    return head, body


def header(name: str) -> str:
    """The header comment of ``lua/<name>.lua`` (a fragment: ``_NAME``)."""
    return _split(name)[0]


@cache
def _body(name: str) -> str:
    def include(m: re.Match[str]) -> str:
        body = _body(f"_{m.group(1)}")
        if not body.endswith("\n"):
            raise ValueError(f"fragment _{m.group(1)}.lua does not end with a newline")
        return body

    return _INCLUDE.sub(include, _split(name)[1])


@cache
def text(name: str) -> str:
    """The script ``name`` as sent to Redis: includes and constants resolved."""
    if name.startswith("_"):
        raise ValueError(f"{name} is a fragment, not a script")

    def constant(m: re.Match[str]) -> str:
        if m.group(1) not in CONSTANTS:
            raise ValueError(f"{name}.lua: unknown constant ${{{m.group(1)}}}")
        return CONSTANTS[m.group(1)]

    return _CONSTANT.sub(constant, _body(name))


class RawScript:
    """A script and its SHA; :meth:`call` packs one ``EVALSHA`` with one key by hand (the
    cluster backend's batches, sent without redis-py's command path: ``nodes.py``)."""

    def __init__(self, script: str) -> None:
        self.script = script
        self.sha = hashlib.sha1(script.encode()).hexdigest().encode()

    def call(self, key: bytes, args: Sequence[bytes]) -> bytes:
        return resp.command(b"EVALSHA", self.sha, b"1", key, *args)


@cache
def raw(name: str) -> RawScript:
    """:class:`RawScript` of the script ``name`` (one object per script)."""
    return RawScript(text(name))
