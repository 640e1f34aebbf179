"""What ``kvmesh gateway`` says once at start: how it isolates callers, and what to do about it.

Isolation is the right default (a shared cache whose hits a caller can time is an oracle of
other callers' prompts: ``client.gateway.tenants``), but it is silent: a benchmark of shared
prefixes without ``cache_salt`` measures 0% reuse and no one tells it why. So the gateway
says at start, in a few lines, which cache requests share, what to change to share more or
less (tenant keys, ``cache_salt``, ``--insecure-shared-cache``), and who "the tenant" of the
concurrency cap is (without tenant keys: the client's IP address, so a whole benchmark host
is one tenant), and, under ``--max-concurrent``, how waiting requests share the slots.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from client.gateway.app import GatewayConfig


def startup_notice(config: GatewayConfig) -> str:
    """The start-up lines for ``config`` (no secrets: no keys, no salts)."""
    cap = (f"--max-concurrent-per-tenant {config.max_concurrent}: prompts one tenant may have "
           "generating at once (429 above)")
    if config.tenancy is not None:
        return (f"kvmesh gateway: cache isolation per tenant (--tenant-keys, "
                f"{len(config.tenancy.tenants)} tenant(s)): each API key's tenant shares its "
                "own prefix cache and sees its own cached-token counts; a request's cache_salt "
                "narrows it further, never into another tenant's.\n"
                f"kvmesh gateway: {cap}, per API key's tenant.{_admission(config)}")
    if config.shared_cache:
        isolation = ("kvmesh gateway: --insecure-shared-cache: requests without cache_salt "
                     "share one cache, and each caller's latency shows what others asked (a "
                     "timing oracle); their cached-token counts are hidden from them "
                     "(operators: kvmesh_gateway_shared_cache_cached_tokens_total on "
                     "/metrics). Requests with cache_salt share only with that salt.")
    else:
        isolation = ("kvmesh gateway: cache isolation per request: without --tenant-keys, a "
                     "request without cache_salt gets a random salt and reuses no cached "
                     "prefix (answers say so in x-kvmesh-cache-scope). To share prefixes: "
                     "--tenant-keys FILE (callers send their API key; each tenant shares its "
                     "own cache), or the same unguessable cache_salt in the request body, or, "
                     "only where every caller trusts every other, --insecure-shared-cache.")
    return (f"{isolation}\nkvmesh gateway: {cap}; without --tenant-keys the tenant is the "
            "client's IP address, so every caller on one host (a benchmark) is one tenant."
            f"{_admission(config)}")


def _admission(config: GatewayConfig) -> str:
    """The line on fair admission under ``--max-concurrent`` (none when unbounded)."""
    if not config.max_total:
        return ""
    weights = ", ".join(f"{t}={w:g}" for t, w in sorted(config.tenant_weights.items()))
    shares = (f"weighted fair shares ({weights}; any other tenant 1)" if weights
              else "equal fair shares (--tenant-weights to change them)")
    who = ("per API key's tenant" if config.tenancy is not None else
           "without --tenant-keys all requests are one tenant, so they go in arrival order")
    return (f"\nkvmesh gateway: --max-concurrent {config.max_total}: above it requests wait "
            f"(at most {config.max_wait_s:g} s, then 503) and free slots go out in {shares}, "
            f"{who}.")
