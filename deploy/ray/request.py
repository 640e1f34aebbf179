"""The request a kvmesh Ray Serve deployment takes, as routers see it.

Ray Serve hands a request router the call's arguments (``PendingRequest.args``); kvmesh's
router reads ``token_ids``, ``salt`` and ``tenant`` from the first argument that has them, Ray's
``PrefixCacheAffinityRouter`` reads ``prompt`` (text). ``ServeRequest`` carries all of them;
a plain dict with the same keys works too. Importing this module is cheap (no Ray).

kvmesh's router also writes ``fetch`` into that argument: worker id -> the serialized
``FetchPlan`` (``index.proto``) the service planned for that replica's worker. Serve picks the
replica among the router's ranks, so the router cannot know which one runs the request; each
replica takes its own plan (:func:`fetch_plan_for`), whose ticket only its worker can use.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ServeRequest:
    """One generation request: token ids (+ tenant salt), tokens to generate, and the text.
    ``tenant``: whom it is for (``kvmesh.quota``; None: the default tenant), a label the
    router sends with its Route and the replica's worker charges the blocks it caches to."""

    token_ids: list[int]
    salt: str | None = None
    max_tokens: int = 1
    prompt: str = ""
    fetch: dict[str, bytes] | None = None  # set by kvmesh's router (see the module docstring)
    tenant: str | None = None


def request_field(request: Any, name: str, default: Any = None) -> Any:
    """``request[name]`` for a dict, ``request.name`` otherwise; ``default`` when absent."""
    if isinstance(request, dict):
        return request.get(name, default)
    return getattr(request, name, default)


def set_fetch_plans(args: list[Any], plans: dict[str, bytes]) -> bool:
    """Write ``plans`` as ``fetch`` into the first of ``args`` carrying ``token_ids`` (the
    argument the router routed by); False when none does."""
    for arg in args:
        if request_field(arg, "token_ids"):
            if isinstance(arg, dict):
                arg["fetch"] = plans
            else:
                arg.fetch = plans
            return True
    return False


def fetch_plan_for(request: Any, worker_id: str) -> bytes | None:
    """The serialized ``FetchPlan`` the router attached for worker ``worker_id``, if any."""
    plans = request_field(request, "fetch") or {}
    return plans.get(worker_id) if isinstance(plans, dict) else None
