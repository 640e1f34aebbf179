"""Wait for ZMQ sockets on the asyncio loop without ``zmq.asyncio.Poller``.

One reader per socket FD for the socket's life and one future per wait (the poller cost a
tenth of the ingest). ZMQ's FD is edge-triggered, so ``poll`` reads ``EVENTS`` of every socket
not known empty before waiting, and a caller says ``emptied`` after draining to ``zmq.Again``.

See docs/architecture.md#bridge-ingest-and-recovery.
"""
from __future__ import annotations

import asyncio
import math

import zmq

EVENTS, POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)  # plain ints: the enums cost more than
# the option call (``sock.EVENTS & zmq.POLLIN`` took twice ``getsockopt(EVENTS) & POLLIN``)


class Wake:
    """Readiness of ``socks`` (blocking sockets: shadows are fine) for one task at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *socks: zmq.Socket) -> None:
        self._loop = loop
        self._get = [s.getsockopt for s in socks]
        self._fds = [s.FD for s in socks]
        self._unknown = [True] * len(socks)  # not found empty since last returned readable
        self._waiter: asyncio.Future[int] | None = None  # the socket's index; -1: time
        # One timer outlives the waits it serves: a deadline that moves later (the probe's,
        # after every batch) is not re-armed per wait; the early fire is a spurious wake.
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        for i, fd in enumerate(self._fds):
            loop.add_reader(fd, self._wake, i)

    def emptied(self, i: int) -> None:
        """Socket ``i`` raised ``zmq.Again`` since ``poll`` returned: its next message signals."""
        self._unknown[i] = False

    async def poll(self, until: float | None) -> list[bool]:
        """Per socket, whether it is readable, after one turn of the loop at least: at once
        when one is already (the turn lets other tasks run between drains), else once one
        turns readable or the loop's time passes ``until`` (then all ``False`` or what is
        readable by then)."""
        now = self._check()
        if any(now):
            await asyncio.sleep(0)
            return now
        if until is not None and until < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(until, self._expire)
            self._timer_at = until
        self._waiter = self._loop.create_future()
        try:
            i = await self._waiter
        finally:
            self._waiter = None
        if i < 0:  # (rare: every socket is read afresh)
            self._unknown = [True] * len(now)
            return self._check()
        now[i] = self._unknown[i] = True
        return now  # (another socket readable meanwhile: the next poll finds it)

    def close(self) -> None:
        """Remove the readers and the timer (before the sockets close: no callback may
        touch a closed socket's FD)."""
        for fd in self._fds:
            self._loop.remove_reader(fd)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> list[bool]:
        now = [False] * len(self._get)
        for i, get in enumerate(self._get):
            if self._unknown[i]:
                now[i] = self._unknown[i] = bool(get(EVENTS) & POLLIN)
        return now

    def _wake(self, i: int) -> None:
        # Reading EVENTS takes the FD's signal, whoever waits: the selector is
        # level-triggered and would call again every turn until someone did. And it tells a
        # message from a signal that brought none (a command, or one the selector reported
        # before the task read EVENTS itself: the task may be waiting again by now).
        if self._get[i](EVENTS) & POLLIN:
            self._unknown[i] = True
            w = self._waiter
            if w is not None and not w.done():
                w.set_result(i)

    def _expire(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(-1)
