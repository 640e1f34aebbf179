"""Tenancy: API keys -> tenants, and the cache salt each request gets.

With a tenant-keys file the gateway decides the salt (an HMAC of the tenant, and of its
``cache_salt`` if any), so no tenant can produce another's. Without one, isolation is still the
default: a request's ``cache_salt`` is its salt, and one without gets a random salt; only
``shared=True`` shares a cache. Cached-token counts are reported only for a salt the caller
holds; ``x-kvmesh-cache-scope`` says which cache served.

See docs/architecture.md#the-openai-gateway.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from client.gateway.key_file import key_file_pairs
from kvmesh.ops.file_perms import warn_if_readable_by_others
from kvmesh.quota import check_tenant

SALT_CONTEXT = b"kvmesh-tenant\0"
CACHE_SCOPE_HEADER = "x-kvmesh-cache-scope"
# A random salt is the default: say so where a benchmark reading 0% reuse will look.
PRIVATE_SCOPE = ("request; a random salt of its own, so no prefix is reused between requests: "
                 "send cache_salt, or an API key of the gateway's --tenant-keys, to share one")


@dataclass(frozen=True)
class Salting:
    """The salt one request is hashed with, whether its cache hits may be reported, and
    the cache it shares (``scope``: ``tenant``, ``cache_salt``, ``shared``, ``request``)."""

    salt: str | None
    report_cached: bool
    scope: str = "request"

    def headers(self) -> dict[str, str]:
        """The ``x-kvmesh-cache-scope`` header of an answer served under this salt."""
        return {CACHE_SCOPE_HEADER: PRIVATE_SCOPE if self.scope == "request" else self.scope}


def salting(tenancy: Tenancy | None, tenant: str | None, cache_salt: str | None,
            shared: bool = False) -> Salting:
    """The salt of a request from ``tenant`` (None without tenancy) carrying ``cache_salt``.

    Invariant: ``salt`` is None only when ``shared`` and neither tenancy nor ``cache_salt``
    apply, and exactly then ``report_cached`` is False.
    """
    if tenancy is not None and tenant is not None:
        return Salting(tenancy.salt(tenant, cache_salt), True, "tenant")
    if cache_salt:
        return Salting(cache_salt, True, "cache_salt")
    if shared:
        return Salting(None, False, "shared")
    return Salting(secrets.token_hex(16), True, "request")  # private to this request (batch)


class TenantKeyError(ValueError):
    """The tenant-keys file is malformed (the message names the line or entry)."""


def _key_digest(api_key: str) -> bytes:
    # Keys are looked up by digest so the lookup's timing says nothing about the keys.
    return hashlib.sha256(api_key.encode("utf-8")).digest()


def parse_tenant_keys(text: str) -> dict[str, str]:
    """The ``api key -> tenant`` mapping of a key file's ``text`` (JSON object or lines).

    Raises ``TenantKeyError`` on malformed input, empty keys or tenants, a key given twice,
    or a tenant name the wire refuses (``kvmesh.quota.check_tenant``: spaces, control
    characters, over 64 bytes, ``*``).
    """
    pairs = key_file_pairs(text, "tenant keys", "<api key> <tenant>", second_optional=False,
                           error=TenantKeyError)
    out: dict[str, str] = {}
    for n, (key, tenant) in enumerate(pairs, 1):  # messages never quote a key
        if not isinstance(tenant, str) or not key or not tenant or "\0" in tenant:
            raise TenantKeyError(f"tenant keys entry {n}: needs a key and a non-empty tenant "
                                 "name without NUL characters")
        if key in out:
            raise TenantKeyError(f"tenant keys entry {n}: this key is already listed")
        try:  # the name travels as RouteRequest.tenant / GenerateRequest.tenant (quotas)
            check_tenant(tenant)
        except ValueError as exc:
            raise TenantKeyError(f"tenant keys entry {n}: {exc}; tenant names are the labels "
                                 "cache quotas name (kvmesh quota set TENANT)") from None
        out[key] = tenant
    if not out:
        raise TenantKeyError("tenant keys: the file lists no key")
    return out


class Tenancy:
    """Authenticates API keys and derives each tenant's salt (see the module docstring)."""

    def __init__(self, keys: Mapping[str, str], secret: bytes | str | None = None) -> None:
        """Raises ``TenantKeyError`` for a tenant name the wire refuses (see
        :func:`parse_tenant_keys`)."""
        for tenant in set(keys.values()):
            try:
                check_tenant(tenant)
            except ValueError as exc:
                raise TenantKeyError(f"tenant keys: {exc}") from None
        self._tenants = {_key_digest(k): t for k, t in keys.items()}
        if secret is None or secret == b"" or secret == "":
            secret = secrets.token_bytes(32)
            self.random_secret = True
        else:
            self.random_secret = False
        self._secret = secret.encode("utf-8") if isinstance(secret, str) else secret

    @classmethod
    def from_file(cls, path: str | Path, secret: bytes | str | None = None) -> Tenancy:
        """Load a key file (warning when others may read it); raises ``OSError`` or
        ``TenantKeyError``."""
        warn_if_readable_by_others(path, "--tenant-keys file")
        return cls(parse_tenant_keys(Path(path).read_text(encoding="utf-8")), secret)

    @property
    def tenants(self) -> set[str]:
        """The tenant names the key file knows."""
        return set(self._tenants.values())

    def tenant_for(self, authorization: str | None) -> str | None:
        """The tenant of an ``Authorization: Bearer <key>`` header value; ``None`` when the
        header is missing, malformed or carries an unknown key."""
        if not authorization:
            return None
        scheme, _, key = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return None
        return self._tenants.get(_key_digest(key.strip()))

    def salt(self, tenant: str, cache_salt: str | None = None) -> str:
        """The salt for ``tenant``'s request, optionally narrowed by its ``cache_salt``."""
        message = SALT_CONTEXT + tenant.encode("utf-8")
        if cache_salt:
            message += b"\0" + cache_salt.encode("utf-8")
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()
