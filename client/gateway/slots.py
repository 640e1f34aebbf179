"""Per-tenant concurrency: how many prompts one tenant may have generating at once.

A request takes one slot per prompt (a batch of 8 takes 8) for as long as it generates (a
stream until its last event); a request that does not fit in its tenant's free slots is
refused at once with 429 and ``Retry-After``, before anything is routed, so one tenant
cannot occupy every worker while others wait. The tenant is the API key's tenant, or, without
tenant keys, the caller's IP address (``slot_owner``): a benchmark host is then one tenant,
so the 429's message names the flag that raises the cap. Slots live in this process: N
gateway replicas allow N times the cap. Under a gateway-wide bound (``--max-concurrent``)
``client.gateway.fair_slots`` queues requests fairly; a waiting prompt holds its cap slot.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from client.gateway.limits import DEFAULT_MAX_CONCURRENT, RETRY_AFTER_S
from kvmesh.openai.errors import OpenAIError

_ADDRESS_OWNER = "addr\0"


def slot_owner(tenant: str | None, client_host: str | None) -> str:
    """Whose slots a request takes: its tenant, else its client address."""
    if tenant is not None:
        return f"tenant\0{tenant}"
    return f"{_ADDRESS_OWNER}{client_host or '?'}"


class Lease:
    """Slots held by one request; ``release`` gives them back (``give_back`` runs once,
    however many times it is called)."""

    def __init__(self, give_back: Callable[[], None]) -> None:
        self._give_back: Callable[[], None] | None = give_back

    def release(self) -> None:
        give_back, self._give_back = self._give_back, None
        if give_back is not None:
            give_back()


class TenantSlots:
    """At most ``limit`` slots in use per tenant (single event loop: no lock needed)."""

    def __init__(self, limit: int = DEFAULT_MAX_CONCURRENT) -> None:
        if limit < 1:
            raise ValueError("the per-tenant concurrency limit must be at least 1")
        self.limit = limit
        self._used: Counter[str] = Counter()

    def in_use(self, tenant: str) -> int:
        """Slots ``tenant`` holds now."""
        return self._used[tenant]

    def take(self, tenant: str, count: int = 1) -> Lease:
        """``count`` slots for ``tenant``; raises a 429 ``OpenAIError`` when they do not fit."""
        if self._used[tenant] + count > self.limit:
            raise OpenAIError(429, self._refusal(tenant), code="concurrency_limit",
                              type_="rate_limit_error",
                              headers={"retry-after": str(RETRY_AFTER_S)})
        self._used[tenant] += count
        return Lease(lambda: self._give_back(tenant, count))

    def _refusal(self, tenant: str) -> str:
        cap = (f"at most {self.limit} prompts generating at once per tenant: the gateway's "
               "--max-concurrent-per-tenant")
        if tenant.startswith(_ADDRESS_OWNER):
            return (f"too many concurrent requests from this client address ({cap}; without "
                    "--tenant-keys every caller from one IP address is one tenant); retry "
                    "later")
        return f"too many concurrent requests for this tenant ({cap}); retry later"

    def _give_back(self, tenant: str, count: int) -> None:
        self._used[tenant] -= count
        if self._used[tenant] <= 0:
            del self._used[tenant]


class LeasedStream(StreamingResponse):
    """A stream that gives its tenant's slots back when it ends, however it ends."""

    def __init__(self, *args: Any, lease: Lease, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lease = lease

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.lease.release()
