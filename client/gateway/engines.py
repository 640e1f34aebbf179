"""The operator's list of HTTP engines the gateway may forward to, and each engine's key.

A ``Route`` answer can never decide where the gateway's traffic goes: it forwards only to
addresses listed here (``--engine-allow``, ``--engine-keys``), sends to the address as listed,
and presents each engine only its own key. Addresses compare in one canonical form
``scheme://host:port``.

See docs/architecture.md#the-openai-gateway.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from client.gateway.key_file import key_file_pairs
from client.results import Candidate
from kvmesh.ops.file_perms import warn_if_readable_by_others
from kvmesh.rpc.engine_address import is_http

log = logging.getLogger("client.gateway")
_LOGGED_AT_MOST = 1024  # unlisted addresses named in the log (a worker may register many)

_DEFAULT_PORTS = {"http": 80, "https": 443}


class EngineListError(ValueError):
    """An engine address or the engine-keys file is malformed (the message says where; it
    never quotes a key)."""


def canonical(address: str) -> str:
    """``scheme://host:port`` of an HTTP engine's base URL. Raises ``EngineListError`` for
    anything that is not ``http(s)://host[:port][/]`` (user info, a path, a query)."""
    try:
        parts = urlsplit(address.strip())
        port = parts.port
    except ValueError as exc:
        raise EngineListError(f"engine address {address[:80]!r}: {exc}") from None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname or parts.username \
            or parts.password or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise EngineListError(f"engine address {address[:80]!r}: expected "
                              "http://HOST:PORT or https://HOST:PORT")
    host = parts.hostname.lower()
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}:{port or _DEFAULT_PORTS[parts.scheme]}"


def split_addresses(values: Iterable[str] | None) -> list[str]:
    """``--engine-allow`` values, each one address or several separated by commas."""
    return [a.strip() for v in values or () for a in v.split(",") if a.strip()]


@dataclass(frozen=True)
class EngineList:
    """Canonical engine address -> the key to present there (None: no key).

    Invariant: a key is only ever looked up by the canonical address it was configured for,
    so it reaches that engine and no other.
    """

    keys: Mapping[str, str | None] = field(default_factory=dict)

    @classmethod
    def build(cls, allow: Iterable[str] = (), default_key: str | None = None,
              keys_file: str | Path | None = None) -> EngineList:
        """The list from ``--engine-allow`` values (addresses, comma-separated or not),
        ``--engine-api-key`` and ``--engine-keys``; raises ``EngineListError`` (or
        ``OSError``) for bad input."""
        out: dict[str, str | None] = {canonical(a): default_key or None
                                      for a in split_addresses(allow)}
        if keys_file is not None:
            warn_if_readable_by_others(keys_file, "--engine-keys file")
            text = Path(keys_file).read_text(encoding="utf-8")
            for address, key in parse_engine_keys(text).items():
                out[address] = key or default_key or None
        return cls(out)

    def __bool__(self) -> bool:
        return bool(self.keys)

    def allowed(self, address: str) -> str | None:
        """The canonical form of ``address`` when the operator listed it, else None."""
        try:
            wanted = canonical(address)
        except EngineListError:
            return None
        return wanted if wanted in self.keys else None

    def key(self, allowed: str) -> str | None:
        """The key configured for ``allowed`` (a value :meth:`allowed` returned)."""
        return self.keys[allowed]


def parse_engine_keys(text: str) -> dict[str, str | None]:
    """Canonical address -> key (None: the default key) of an engine-keys file's ``text``.

    Raises ``EngineListError`` on malformed input or an address listed twice.
    """
    pairs = key_file_pairs(text, "engine keys", "<address> [<key>]", second_optional=True,
                           error=EngineListError)
    out: dict[str, str | None] = {}
    for n, (address, key) in enumerate(pairs, 1):
        if key is not None and (not isinstance(key, str) or not key):
            raise EngineListError(f"engine keys entry {n}: the key must be a non-empty "
                                  "string (or null for --engine-api-key)")
        name = canonical(str(address))
        if name in out:
            raise EngineListError(f"engine keys entry {n}: {name} is already listed")
        out[name] = key
    return out


class _Counter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class EngineGate:
    """Drops the HTTP engines an ``EngineList`` does not name from ``Route`` candidates,
    counting each (``refused``) and logging each address once."""

    def __init__(self, engines: EngineList, refused: _Counter) -> None:
        self.engines = engines
        self._refused = refused
        self._logged: set[str] = set()

    def listed(self, candidates: Iterable[Candidate]) -> list[Candidate]:
        """``candidates`` (ranking order kept) without the unlisted HTTP engines."""
        out = []
        for cand in candidates:
            if not is_http(cand.address) or self.engines.allowed(cand.address):
                out.append(cand)
                continue
            self._refused.inc()
            if cand.address not in self._logged and len(self._logged) < _LOGGED_AT_MOST:
                self._logged.add(cand.address)
                log.warning("worker %r registered the HTTP engine address %r, which is not in "
                            "the gateway's engine list (--engine-allow, --engine-keys): "
                            "nothing is sent there", cand.worker_id, cand.address)
        return out
