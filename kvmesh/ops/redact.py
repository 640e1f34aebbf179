"""Passwords out of URLs before they are printed or logged.

A Redis URL carries its password (``redis://:PASSWORD@host:port/0``, or a ``password=``
query argument, which redis-py also honours). Anything kvmesh prints or logs passes such a
URL through :func:`redact_url` first.

Contract: ``redact_url`` replaces the password of the userinfo and every ``password``
query value with ``***`` and leaves everything else (scheme, user name, host, port, path,
other query arguments) as it was; a URL without a password, or a string that is not a URL,
comes back unchanged.
"""
from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["MASK", "redact_url"]

MASK = "***"


def redact_url(url: str) -> str:
    """``url`` with its password(s) replaced by ``***`` (see the module contract)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not a URL (a bad port, say): nothing we can safely rewrite
        return url
    netloc, query = parts.netloc, parts.query
    if password is not None:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        netloc = f"{user}:{MASK}@{hostport}"
    pairs = parse_qsl(query, keep_blank_values=True)
    if any(k == "password" for k, _ in pairs):
        query = urlencode([(k, MASK if k == "password" else v) for k, v in pairs], safe="*/")
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=query))
