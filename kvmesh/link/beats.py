"""The beat side of the index link: registrations and heartbeats, apart from the events.

:class:`Beats` is a part of :class:`kvmesh.link.link.Link` (its state and calls are the
link's): the beat task registers when needed and heartbeats every ``heartbeat_s``, early
(at most every ``EAGER_BEAT_S``) when the feed's load changed or an answer needs a
recheck. It never waits on events, so no publish problem takes a healthy worker out of
routing; on a ``BeatThread`` it runs on that thread's loop with a channel of its own, and
only reads the events side's numbers, raises its flags (``registered``, ``need_sync``: set
after the service answered, ``need_sync`` first) and wakes it thread-safely. A heartbeat
whose resync answer raced a publish or snapshot (the index may be ahead of the
``last_seq`` it carried) is no evidence of a lost index: it is rechecked by a heartbeat
soon after, never obeyed. A heartbeat carries the version of the tenant quotas the side
applies (``quota_version``); an answer with quotas hands them to the feed
(``Feed.quotas``), and the version it reports next is theirs; malformed quotas are logged
and ignored (the side keeps its own, and the service sends them again next beat).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

from kvmesh.link.beat_thread import wake
from kvmesh.link.conn import Conn, Stub
from kvmesh.rpc.retry import Backoff
from kvmesh.v1 import index_pb2

log = logging.getLogger("kvmesh.link")
EAGER_BEAT_S = 0.1  # the soonest a heartbeat follows another (a load change, a recheck)


class Beats:
    """The beat task of a :class:`~kvmesh.link.link.Link` (a base of it, not used alone)."""

    # the link's, set by its constructor
    _beat_loop: asyncio.AbstractEventLoop | None
    _beat_kick: asyncio.Event
    _beat_load: index_pb2.WorkerLoad
    _recheck: bool
    feed: Any
    quota_version: int  # the TenantQuotas.version the side applies (0: none)

    def _wake_beats(self) -> None:
        """Wake the beat task (any thread): a registration or a load change to tell."""
        wake(self._beat_loop, self._beat_kick)

    async def _beats_apart(self) -> None:
        """The beat task on the beat thread, through a channel of its own."""
        self.beat_conn = self.conn.twin()
        try:
            await self._beats(self.beat_conn)
        finally:
            await self.beat_conn.close()

    def _eager(self) -> bool:
        return self._recheck or self.feed.load_changed(self._beat_load)

    async def _beats(self, conn: Conn) -> None:
        """Register when needed and heartbeat every ``heartbeat_s`` (early on a load change
        or a recheck, at most every ``EAGER_BEAT_S``); nothing here waits on events."""
        self._beat_loop = asyncio.get_running_loop()
        backoff = Backoff()
        due = last = hold = 0.0
        while not self._closed:
            now = time.monotonic()
            eager = self._eager() and now - last >= EAGER_BEAT_S
            if now >= hold and (not self.registered or now >= due or eager):
                sent = await self._beat(conn, backoff)
                if sent is False:
                    continue
                if sent is None:  # nothing true to tell now: look again in a heartbeat
                    hold = due = now + self.heartbeat_s
                else:
                    last = time.monotonic()
                    due = last + self.heartbeat_s
            wait = max(0.0, due - time.monotonic())
            if self._eager():
                wait = min(wait, max(0.0, last + EAGER_BEAT_S - time.monotonic()))
            self._beat_kick.clear()
            try:
                await asyncio.wait_for(self._beat_kick.wait(), timeout=wait)
            except TimeoutError:
                pass

    async def _beat(self, conn: Conn, backoff: Backoff) -> bool | None:
        """One registration or heartbeat: True when answered, False when it failed, None
        when none was sent (no load, a stale worker, no model to register with)."""
        load = await self._sample()
        if load is None:
            return None
        why = self.stale()
        if why is not None:
            self.counters["stale_beats"] += 1
            self._warn("stale", "%s: no heartbeat while %s (it leaves routing after the "
                       "liveness timeout)", self.worker_id, why)
            return None
        if self.registered:
            return await self._attempt(functools.partial(self._heartbeat, load=load),
                                       backoff, conn)
        model = self.feed.model()
        if not model:
            self._warn("model", "%s: no model known (none given, none reported); not "
                       "registering", self.worker_id)
            return None
        return await self._attempt(functools.partial(self._register, load=load, model=model),
                                   backoff, conn)

    async def _sample(self) -> index_pb2.WorkerLoad | None:
        load = await self.feed.load()
        if load is None:
            self.counters["silent_beats"] += 1
            if not self.silent:
                log.warning("%s: no load to tell (the engine does not answer); no heartbeat "
                            "until there is (it leaves routing after the liveness timeout)",
                            self.worker_id)
        elif self.silent:
            log.info("%s: the engine answers again", self.worker_id)
        self.silent = load is None
        return load

    def stale(self) -> str | None:
        """Why a heartbeat now would not tell the truth about the worker, or None."""
        return None


    async def _register(self, stub: Stub, *, load: index_pb2.WorkerLoad, model: str) -> None:
        self.register_req.model = model
        self.register_req.load.CopyFrom(load)
        resp = await stub.RegisterWorker(self.register_req, timeout=self.timeout,
                                         metadata=self.metadata)
        if resp.heartbeat_interval_ms:
            self.heartbeat_s = resp.heartbeat_interval_ms / 1000
        if resp.liveness_timeout_ms:
            self.liveness_s = resp.liveness_timeout_ms / 1000
        self.limits.reset()
        self.acked_at = time.monotonic()  # a fresh index: nothing was waiting for it
        self.need_sync = True  # a snapshot after every registration (set first: see above)
        self.registered = True
        self.counters["registrations"] += 1
        self._wake()

    async def _heartbeat(self, stub: Stub, *, load: index_pb2.WorkerLoad) -> None:
        self._beat_load = load
        self._recheck = False
        quiet, epoch = self._inflight == 0, self._epoch
        resp = await stub.Heartbeat(index_pb2.HeartbeatRequest(
            worker_id=self.worker_id, load=load, last_seq=self.last_seq,
            incarnation=self.incarnation, quota_version=self.quota_version),
            timeout=self.timeout, metadata=self.metadata)
        self.counters["heartbeats"] += 1
        if resp.HasField("quotas"):
            await self._take_quotas(resp.quotas)
        if resp.reregister:
            self.registered = False
        elif resp.resync and not (quiet and epoch == self._epoch):
            # A publish or sync overlapped this beat: the index may be ahead of the
            # last_seq it carried. Not evidence of a lost index: ask again soon instead.
            self.counters["beat_resync_deferred"] += 1
            self._recheck = True
            return
        if resp.resync:
            self.need_sync = True
            self._wake()

    async def _take_quotas(self, quotas: index_pb2.TenantQuotas) -> None:
        """Hand a heartbeat answer's quotas to the feed; report their version from now on."""
        try:
            await self.feed.quotas(quotas)
        except ValueError as e:
            self.counters["bad_quotas"] += 1
            self._warn("quotas", "%s: ignoring malformed tenant quotas (version %d), keeping "
                       "version %d: %s", self.worker_id, quotas.version, self.quota_version, e)
            return
        self.quota_version = quotas.version
        self.counters["quota_updates"] += 1
        log.info("%s: tenant quotas version %d applied", self.worker_id, quotas.version)
