"""Weighted fair admission: which tenant gets the gateway's next free slot under overload.

The gateway runs at most ``total`` prompts at once (``--max-concurrent``; 0: no bound, and
nothing ever waits). A request that finds too few free slots waits in its tenant's FIFO
queue; whenever slots free up, the next request admitted is the head of the queue with the
smallest start tag of start-time fair queueing (SFQ; Goyal, Vin and Cheng, SIGCOMM 1996):

- each tenant ``t`` has a weight ``w(t)`` (``--tenant-weights``, default 1) and a finish tag
  ``F(t)``; the virtual time ``V`` is the start tag of the request admitted last;
- a request of ``n`` prompts that becomes the head of its tenant's queue gets the start tag
  ``S = max(V, F(t))``; admitting it sets ``V = S`` and ``F(t) = S + n / w(t)``. A request
  admitted at once (free slots, nobody waiting) is tagged the same way, so a tenant that
  filled the slots while they were free waits behind the others once they are not.

Guarantees (each a unit test): FIFO within a tenant; a tenant whose queue was empty is
admitted before the next request of any tenant already served at ``V`` (so one round at
most behind another tenant's backlog, however long); while tenants stay backlogged their
admitted prompts are in proportion to their weights (2:1 weights give exactly 2:1 over
each round); a waiter that gives up (cancelled, its client gone, ``max_wait_s`` passed)
leaves the queue and never holds a slot. Ties go to the earlier request.

The fair-share tenant (``share``) is the API key's tenant, or ``kvmesh.quota.DEFAULT_TENANT``
for every request without one. The per-tenant cap (``client.gateway.slots.TenantSlots``,
``--max-concurrent-per-tenant``) still holds, and counts a tenant's waiting prompts too: a
request over it is refused at once with 429, so the queues are bounded by tenants x cap.
Single event loop: no locks.

See docs/architecture.md#per-tenant-quotas-tenants-on-the-wire-and-fair-admission.
"""
from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from itertools import count as counter

from starlette.requests import Request

from client.gateway.limits import DEFAULT_MAX_WAIT_S, RETRY_AFTER_S
from client.gateway.slots import Lease, TenantSlots, slot_owner
from kvmesh.openai.errors import OpenAIError
from kvmesh.quota import DEFAULT_TENANT, check_tenant


def parse_weights(text: str | list[str] | None) -> dict[str, float]:
    """``--tenant-weights a=2,b=1`` (repeatable or comma-separated) as ``{tenant: weight}``;
    ``ValueError`` naming the entry for a missing ``=``, a weight that is not a finite
    number > 0, a tenant name the wire refuses, or a tenant given twice."""
    items = [text] if isinstance(text, str) else list(text or ())
    out: dict[str, float] = {}
    for entry in (e.strip() for item in items for e in item.split(",")):
        if not entry:
            continue
        name, sep, value = (part.strip() for part in entry.partition("="))
        try:
            weight = float(value) if sep and name else math.nan
        except ValueError:
            weight = math.nan
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"--tenant-weights {entry!r}: expected TENANT=WEIGHT with a "
                             "weight > 0, e.g. a=2,b=1")
        try:
            check_tenant(name)
        except ValueError as exc:
            raise ValueError(f"--tenant-weights {entry!r}: {exc}") from None
        if name in out:
            raise ValueError(f"--tenant-weights: tenant {name!r} is given twice")
        out[name] = weight
    return out


@dataclass(eq=False)
class _Waiter:
    share: str
    count: int
    seq: int = 0        # arrival order: FIFO within a tenant, ties between tenants
    start: float = 0.0  # the SFQ start tag, set when it becomes its queue's head
    granted: asyncio.Future[None] | None = None  # resolved when admitted (waiters only)


class FairSlots:
    """At most ``total`` prompts admitted at once (0: no bound), given out in weighted fair
    shares when tenants wait; see the module docstring."""

    def __init__(self, total: int, caps: TenantSlots,
                 weights: Mapping[str, float] | None = None,
                 max_wait_s: float = DEFAULT_MAX_WAIT_S) -> None:
        if total < 0:
            raise ValueError("--max-concurrent must be 0 (no bound) or more")
        if not max_wait_s > 0:
            raise ValueError("--max-queue-wait must be more than 0 seconds")
        for name, weight in (weights or {}).items():
            if not (math.isfinite(weight) and weight > 0):
                raise ValueError(f"--tenant-weights: {name}'s weight must be > 0, "
                                 f"got {weight}")
        self.total = total
        self.caps = caps
        self.weights = dict(weights or {})
        self.max_wait_s = max_wait_s
        self.admitted = 0
        self._queues: dict[str, deque[_Waiter]] = {}
        self._waiting = 0  # kept, not summed: the metrics thread reads it mid-loop
        self._vtime = 0.0
        self._finish: dict[str, float] = {}
        self._seq = counter()

    async def admit(self, request: Request, tenant: str | None, count: int = 1) -> Lease:
        """:meth:`take` for an HTTP request of ``tenant`` (the API key's; None without
        tenancy): its cap owner is ``slot_owner``'s, its fair share its tenant's (every
        request without one shares the default tenant's), and it stops waiting when its
        client disconnects."""
        owner = slot_owner(tenant, request.client.host if request.client else None)
        return await self.take(owner, tenant or DEFAULT_TENANT, count,
                               gone=lambda: _disconnect(request))

    def waiting(self, share: str | None = None) -> int:
        """Requests waiting (of ``share`` only, when given)."""
        if share is not None:
            return len(self._queues.get(share, ()))
        return self._waiting

    async def take(self, owner: str, share: str, count: int = 1,
                   gone: Callable[[], Awaitable[object]] | None = None) -> Lease:
        """``count`` slots for a request of cap owner ``owner`` (``slots.slot_owner``) and
        fair-share tenant ``share``, waiting for them under overload. Raises a 429
        ``OpenAIError`` over ``owner``'s cap (at once) and a 503 when ``max_wait_s`` passes
        or ``gone()`` (the client's disconnect, awaited only while waiting) returns first.
        Cancelling the caller while it waits leaves nothing held."""
        if self.total and not 1 <= count <= self.total:
            raise ValueError(f"a request of {count} prompts can never fit in "
                             f"--max-concurrent {self.total}")
        cap = self.caps.take(owner, count)  # waiting prompts count against the cap too
        waiter = _Waiter(share, count, next(self._seq))
        if not self.total or (not self._queues and self.admitted + count <= self.total):
            self._tag(waiter)
            self._admit(waiter)
            return Lease(lambda: self._release(count, cap))
        waiter.granted = asyncio.get_running_loop().create_future()
        queue = self._queues.setdefault(share, deque())
        queue.append(waiter)
        self._waiting += 1
        if len(queue) == 1:
            self._tag(waiter)
        self._dispatch()
        try:
            await self._granted(waiter, gone)
        except BaseException:
            if waiter.granted.done() and not waiter.granted.cancelled():
                self._release(count)  # admitted while it was giving up: hand it on
            else:
                waiter.granted.cancel()
                self._forget(waiter)
            cap.release()
            raise
        return Lease(lambda: self._release(count, cap))

    async def _granted(self, waiter: _Waiter,
                       gone: Callable[[], Awaitable[object]] | None) -> None:
        """Return once ``waiter`` is admitted; 503 on the deadline or on ``gone``."""
        watch = asyncio.ensure_future(gone()) if gone is not None else None
        try:
            async with asyncio.timeout(self.max_wait_s):
                if watch is None:
                    await asyncio.shield(waiter.granted)
                else:
                    await asyncio.wait((waiter.granted, watch),
                                       return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            raise OpenAIError(503, f"the gateway is at capacity (--max-concurrent "
                              f"{self.total}) and this request waited its "
                              f"{self.max_wait_s:g} s turn (--max-queue-wait); retry later",
                              code="overloaded",
                              headers={"retry-after": str(RETRY_AFTER_S)}) from None
        finally:
            if watch is not None:
                watch.cancel()
                if watch.done() and not watch.cancelled():
                    watch.exception()  # a failed watch reads as gone; its error is not news
        if not waiter.granted.done():
            raise OpenAIError(503, "the client went away while waiting for a slot",
                              code="client_gone")

    def _tag(self, waiter: _Waiter) -> None:
        waiter.start = max(self._vtime, self._finish.get(waiter.share, 0.0))

    def _admit(self, waiter: _Waiter) -> None:
        self.admitted += waiter.count
        self._vtime = waiter.start
        self._finish[waiter.share] = waiter.start + waiter.count / self.weights.get(
            waiter.share, 1.0)

    def _dispatch(self) -> None:
        """Admit heads in (start tag, arrival) order while their slots are free."""
        while self._queues:
            head = min((q[0] for q in self._queues.values()), key=lambda w: (w.start, w.seq))
            if self.admitted + head.count > self.total:
                return
            self._admit(head)
            self._pop(head)  # after _admit: the next head's tag starts at head's finish
            head.granted.set_result(None)

    def _pop(self, waiter: _Waiter) -> None:
        queue = self._queues[waiter.share]
        queue.popleft()
        self._waiting -= 1
        if queue:
            self._tag(queue[0])
        else:
            del self._queues[waiter.share]

    def _forget(self, waiter: _Waiter) -> None:
        """Take a waiter that gave up out of its queue; those behind may now fit."""
        queue = self._queues.get(waiter.share)
        if queue is None or waiter not in queue:
            return
        if queue[0] is waiter:
            self._pop(waiter)
        else:
            queue.remove(waiter)
            self._waiting -= 1
        self._dispatch()

    def _release(self, count: int, cap: Lease | None = None) -> None:
        self.admitted -= count
        if cap is not None:
            cap.release()
        self._dispatch()


async def _disconnect(request: Request) -> None:
    """Return when the client disconnects: its body is read, so the next ASGI message is
    ``http.disconnect`` (sent when the connection drops, or once the response is done)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
