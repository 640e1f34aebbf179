"""Keep one engine's subscriber running: a failure ends that engine's ingest for a backoff,
never the bridge process (every engine it bridges would leave routing with it).

Contract of :func:`supervise`: runs ``sub.run()`` until cancelled. When it ends by an
exception (a bug, a sink that raised, an exhausted resource: anything an engine's bytes
could provoke that the subscriber did not already take as a malformed batch), the exception
is logged with its traceback and counted (``stats.crashes``), the subscriber is ``reset``
(its engine's state cleared: the index hears ``cleared``, so it never over-claims from a
batch applied halfway), and ``run`` starts again, with fresh sockets, after a backoff:
``first_s`` doubling up to ``max_s``, back to ``first_s`` after a run that lasted
``healthy_s``. A run that returns (it does not, unless cancelled) is restarted too.
``BaseException``s other than ``Exception`` (cancellation, ``KeyboardInterrupt``,
``SystemExit``) pass through. The engine's link is another task: it keeps heartbeating.
"""
from __future__ import annotations

import asyncio
import logging

from bridge.subscriber import Subscriber

log = logging.getLogger("kvmesh.bridge.subscriber")


async def supervise(sub: Subscriber, name: str, *, first_s: float = 0.1, max_s: float = 5.0,
                    healthy_s: float = 30.0) -> None:
    """Run ``sub`` for good (see the module contract)."""
    loop = asyncio.get_running_loop()
    delay = first_s
    while True:
        started = loop.time()
        try:
            await sub.run()
            log.error("%s: the event subscriber returned; it restarts", name)
        except Exception:  # noqa: BLE001 (the contract: this engine alone stops)
            if loop.time() - started >= healthy_s:
                delay = first_s
            log.exception("%s: the event subscriber failed; its index entries are cleared "
                          "and it restarts in %.1f s", name, delay)
        sub.stats.crashes += 1
        try:
            sub.reset()
        except Exception:  # noqa: BLE001 (a sink that fails again: the next run retries)
            log.exception("%s: clearing the engine's state after a failure failed", name)
        await asyncio.sleep(delay)
        delay = min(delay * 2, max_s)
