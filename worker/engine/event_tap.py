"""One reader of the pool's KV events, many consumers: the service link, the vLLM publisher.

``KVCacheManager.take_events`` hands each event out once. A worker with several consumers of
its events (the index link, a vLLM-protocol publisher) therefore takes them in one place, the
tap, after every engine step (``AsyncEngine.on_step``), and gives every consumer the same
events in the same order, with whether the pool dropped unread events since the last take.

Contract of a consumer: ``consumer(engine, events, lost)`` runs on the engine thread after
every step (idle ones too, so load changes are seen), in the order consumers were added; it
must not block and must not change ``events`` (every consumer gets the same list). ``lost``
is true when events were dropped unread before these: the consumer must recover (a snapshot,
a clear) rather than trust its stream.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from kvmesh.events.pool import PoolEvent
from worker.engine.async_engine import AsyncEngine
from worker.engine.engine import Engine

log = logging.getLogger("kvmesh.worker.events")

Consumer = Callable[[Engine, list[PoolEvent], bool], None]


class EventTap:
    """Takes events once per step for every consumer (install with :meth:`install`)."""

    def __init__(self, engine: Engine) -> None:
        self.consumers: list[Consumer] = []
        self._dropped_seen = engine.kv.events_dropped

    @classmethod
    def install(cls, runner: AsyncEngine) -> EventTap:
        """The tap of ``runner``, created and set as its ``on_step`` on first use. Raises
        ``RuntimeError`` when ``on_step`` is already something else (a second reader would
        take events from the first)."""
        current = runner.on_step
        owner = getattr(current, "__self__", None)
        if isinstance(owner, cls):
            return owner
        if current is not None:
            raise RuntimeError("the engine's events already have a reader")
        tap = cls(runner.engine)
        runner.on_step = tap.collect
        return tap

    def add(self, consumer: Consumer) -> None:
        """``consumer`` gets every event taken from now on."""
        self.consumers.append(consumer)

    def collect(self, engine: Engine) -> None:
        """Take the pool's new events and hand them to every consumer (engine thread)."""
        events = engine.kv.take_events()
        dropped = engine.kv.events_dropped
        lost, self._dropped_seen = dropped != self._dropped_seen, dropped
        for consumer in self.consumers:
            try:
                consumer(engine, events, lost)
            except Exception:  # one consumer's bug must not starve the others
                log.exception("a KV event consumer failed")
