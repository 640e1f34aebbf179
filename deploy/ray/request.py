"""The request a kvmesh Ray Serve deployment takes, as routers see it.

Ray Serve hands a request router the call's arguments (``PendingRequest.args``); kvmesh's
router reads ``token_ids`` and ``salt`` from the first argument that has them, Ray's
``PrefixCacheAffinityRouter`` reads ``prompt`` (text). ``ServeRequest`` carries all of them;
a plain dict with the same keys works too. Importing this module is cheap (no Ray).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ServeRequest:
    """One generation request: token ids (+ tenant salt), tokens to generate, and the text."""

    token_ids: list[int]
    salt: str | None = None
    max_tokens: int = 1
    prompt: str = ""


def request_field(request: Any, name: str, default: Any = None) -> Any:
    """``request[name]`` for a dict, ``request.name`` otherwise; ``default`` when absent."""
    if isinstance(request, dict):
        return request.get(name, default)
    return getattr(request, name, default)
