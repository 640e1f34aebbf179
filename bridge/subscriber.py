"""Read one vLLM engine's KV events over ZMQ into an ``EngineState``, recovering from losses.

A SUB socket takes the live stream; a fresh DEALER per request asks the engine's replay
ROUTER for buffered batches. Every index event the state produces goes to ``on_events`` in
order. What holds: a (re)connection, a gap or a quiet stream resyncs from the last applied
batch, which must come back byte for byte (else the engine restarted or moved on: clear and
rebuild from its buffer); a loss nothing can fill clears the engine, so the index may
under-claim, never over-claim; a removal waits in the socket at most ``max_lag_s`` (then the
engine is cleared); the shared ingest loop turns at least every ``TURN_S``. Stop by
cancelling the task running ``run()``.

See docs/architecture.md#bridge-ingest-and-recovery.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from bridge import caps
from bridge.engine_state import EngineState, SeqCheck
from bridge.lag import Bound, Lag
from bridge.replay import ReplayStats, fetch
from bridge.wake import Wake
from kvmesh.events import vllm as ve
from kvmesh.events.zmq_curve import CurveClient
from kvmesh.v1 import index_pb2

Sink = Callable[[list[index_pb2.KvEvent]], None]
REMOVALS = (b"BlockRemoved", b"AllBlocksCleared")  # the tags of events that drop blocks


@dataclass
class SubscriberStats(ReplayStats):  # (replays, replayed, replay_failures/_capped, malformed)
    messages: int = 0        # live messages received
    applied: int = 0         # batches applied (live and replayed)
    duplicates: int = 0      # live batches the last replay already delivered
    gaps: int = 0            # live seq jumps
    restarts: int = 0        # another engine process detected
    unfilled: int = 0        # losses nothing could fill: state cleared
    crashes: int = 0         # run() ended by an exception (the supervisor restarted it)
    connects: int = 0
    disconnects: int = 0
    lag_clears: int = 0      # behind past max_lag_s with removals queued: cleared, skipped
    skipped: int = 0         # queued live batches dropped unread by lag clears


class Subscriber:
    """One engine's event stream (``events``: its PUB endpoint, ``replay``: its ROUTER)."""

    REPLAY_ROUNDS = 3
    DRAIN = 256  # live batches applied per poll at most
    TURN_S = 0.005  # the longest the ingest loop is held before others get a turn (a quiet
    # engine waits a few turns of every busy one: 5 ms kept its lag p50 near 150 ms beside 8
    # saturated engines where 20 ms gave 500 ms, at the same CPU per block)

    def __init__(self, state: EngineState, events: str, replay: str | None, on_events: Sink,
                 *, topic: bytes = b"", replay_timeout: float = 5.0,
                 probe_interval: float | None = 10.0, rcvhwm: int = 100_000,
                 ctx: zmq.asyncio.Context | None = None, max_lag_s: Bound | None = None,
                 name: str | None = None, curve: CurveClient | None = None) -> None:
        self.state = state
        self.events = events
        self.replay = replay
        self.on_events = on_events
        self.topic = topic
        self.replay_timeout = replay_timeout
        self.probe_interval = probe_interval
        self.rcvhwm = rcvhwm
        self.ctx = ctx or zmq.asyncio.Context.instance()
        self.curve = curve  # the engine's sockets are CURVE servers (kvmesh.events.zmq_curve)
        self.stats = SubscriberStats()
        # the last replay (seq -> hash of payload: a replay's rounds hold no payload longer
        # than their own), to recognise queued live copies
        self._dups: dict[int, int] = {}
        # Set by a disconnect: the next live batch may come from another engine process,
        # even with the expected seq, so the anchor is checked (a resync) before applying it.
        self._suspect = False
        # bounded staleness (module contract): None without max_lag_s
        self.lag = Lag(max_lag_s, name or events) if max_lag_s is not None else None
        self._queue: collections.deque[list[bytes]] = collections.deque()  # taken, unread
        self._skipping = False  # dropping the socket's backlog after a lag clear
        self._behind = False  # the last live batch applied was older than the bound

    def reset(self) -> None:
        """After ``run`` ended by an exception (anywhere, even mid-batch): forget all but
        the stats, clear the state (the index hears ``cleared``); the next ``run`` starts
        afresh (its connection resyncs)."""
        self._dups, self._queue = {}, collections.deque()
        self._suspect = self._skipping = self._behind = False
        self._emit(self.state.clear())

    async def run(self) -> None:
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, self.rcvhwm)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.MAXMSGSIZE, caps.MAX_MESSAGE_BYTES)
        sub.subscribe(self.topic)
        if self.curve is not None:
            self.curve.apply(sub)
        mon = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        sub.connect(self.events)
        # blocking twins: receive (and wait, ``Wake``) without zmq.asyncio's futures
        raw = zmq.Socket.shadow(sub.underlying)
        raw_mon = zmq.Socket.shadow(mon.underlying)
        loop = asyncio.get_running_loop()
        wake = Wake(loop, raw_mon, raw)
        probes = self.probe_interval is not None and self.replay is not None
        quiet_since = loop.time()
        try:
            while True:
                until = None
                if self._queue:  # batches taken, unread: hardly a wait, but a full turn of
                    until = loop.time() + 0.001  # the loop (a bare yield let a 1 s batch
                    # run before the liveness ticker)
                elif probes:
                    until = quiet_since + self.probe_interval  # type: ignore[operator]
                mon_in, sub_in = await wake.poll(until)
                if mon_in:
                    msg = raw_mon.recv_multipart(zmq.NOBLOCK)
                    if parse_monitor_message(msg)["event"] == zmq.EVENT_DISCONNECTED:
                        self.stats.disconnects += 1
                        self._suspect = True
                        # libzmq does not reconnect after a protocol error (a frame past
                        # MAXMSGSIZE): connect afresh, whatever the cause
                        with contextlib.suppress(zmq.ZMQError):  # (already gone)
                            sub.disconnect(self.events)
                        sub.connect(self.events)
                    else:
                        self.stats.connects += 1
                        await self._resync()
                if sub_in or self._queue:
                    # (the socket's future-based receive cost more than the batch's
                    # decode: the drain takes even the first batch on the blocking twin)
                    if await self._drain(raw, loop.time() + self.TURN_S):
                        wake.emptied(1)  # raw, the second socket
                    quiet_since = loop.time()
                elif not mon_in and until is not None and loop.time() >= until:
                    # quiet for probe_interval: is the engine still where we are?
                    await self._resync()
                    quiet_since = loop.time()
        finally:
            wake.close()
            sub.disable_monitor()
            mon.close(linger=0)
            sub.close(linger=0)

    # --- live -----------------------------------------------------------------------------

    async def _drain(self, sub: zmq.Socket, until: float) -> bool:
        """Apply the live batches already queued, up to ``DRAIN`` (then the loop polls the
        monitor again): one poll per burst, not per batch, which was most of a batch's cost
        at high rates (a non-blocking receive on the socket's blocking twin skips asyncio's
        futures; ``Wake`` reads the socket's state afresh unless this ended empty). Stops
        past ``until`` (the loop's time). Behind past the bound, takes the backlog first
        (module contract); the subscriber's own queue comes before the socket. ``True``
        when it stopped at an empty socket (``zmq.Again``: its next message signals)."""
        loop = asyncio.get_running_loop()
        for _ in range(self.DRAIN):
            if self._skipping:
                self._skip(sub, until)
                return False
            if loop.time() > until:
                return False
            if self._behind:
                self._take(sub, until)
                continue
            if self._queue:
                frames = self._queue.popleft()
            else:
                try:
                    frames = _recv(sub)
                except zmq.Again:
                    return True
            await self._on_live(frames)
        return False

    async def _on_live(self, frames: list[bytes]) -> None:
        self.stats.messages += 1
        try:
            _, seq, payload = ve.unpack_message(frames)
        except ValueError:
            self.stats.malformed += 1
            return
        kind = self.state.check(seq)
        if self._suspect and kind is SeqCheck.NEXT:
            await self._resync()
            if self._suspect:  # no replay answered: this batch may not follow ours
                self.stats.unfilled += 1
                self._emit(self.state.clear())
        elif kind is SeqCheck.GAP:
            self.stats.gaps += 1
            await self._resync()
        elif kind is SeqCheck.BEHIND and self._dups.get(seq) != hash(payload):
            self.stats.restarts += 1
            self._emit(self.state.clear())
            await self._resync()
        kind = self.state.check(seq)
        if kind is SeqCheck.BEHIND:
            if self._dups.get(seq) == hash(payload):
                self.stats.duplicates += 1
            return
        if kind is SeqCheck.GAP:  # nothing filled it
            self.stats.unfilled += 1
            self._emit(self.state.clear())
        self._dups.clear()  # live is now past every replayed seq: no copy can follow
        await self._apply(seq, payload)
        if self.lag is not None and self.state.last_ts is not None:
            self.lag.observe(self.state.last_ts)
            self._behind = self.lag.behind

    # --- bounded staleness ----------------------------------------------------------------

    def _take(self, sub: zmq.Socket, until: float) -> None:
        """Move the socket's backlog to the own queue, unread, until it is empty or past
        ``until``; a removal among it (or a queue past ``rcvhwm``) clears the engine."""
        loop = asyncio.get_running_loop()
        self._behind = False  # one look per batch applied: the next one looks again
        while loop.time() <= until:
            try:
                frames = _recv(sub)
            except zmq.Again:
                return
            self._queue.append(frames)
            payload = frames[-1]
            if any(tag in payload for tag in REMOVALS) or len(self._queue) > self.rcvhwm:
                self._lag_clear()
                return

    def _lag_clear(self) -> None:
        assert self.lag is not None
        self.stats.lag_clears += 1
        self.stats.skipped += len(self._queue)
        self.lag.cleared(len(self._queue))
        self._queue.clear()
        self._emit(self.state.clear())
        self._skipping = True

    def _skip(self, sub: zmq.Socket, until: float) -> None:
        """Drop the socket's backlog unread until it is empty (ingest resumes from the next
        batch) or past ``until`` (the next turn goes on)."""
        loop = asyncio.get_running_loop()
        while loop.time() <= until:
            try:
                frame = sub.recv(zmq.NOBLOCK, copy=False)
                while frame.more:  # the rest of a message is there once its first frame is
                    frame = sub.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                self._skipping = False
                return
            self.stats.skipped += 1

    async def _apply(self, seq: int, payload: bytes) -> None:
        """Apply one batch slice by slice, a turn of the loop between two once ``TURN_S``
        is spent (nothing else touches the state meanwhile); malformed: clear."""
        parts = self.state.ingest_parts(seq, payload)
        until = time.monotonic() + self.TURN_S
        while True:
            try:
                out = next(parts, None)
            except ValueError:  # MalformedBatch: whatever the bytes made fail
                self.stats.malformed += 1
                self._emit(self.state.clear())
                return
            if out is None:
                break
            self._emit(out)
            if time.monotonic() > until:
                await asyncio.sleep(0)
                until = time.monotonic() + self.TURN_S
        self.stats.applied += 1

    def _emit(self, events: list[index_pb2.KvEvent]) -> None:
        if events:
            self.on_events(events)

    # --- replay ---------------------------------------------------------------------------

    async def _resync(self) -> None:
        """Catch up from the replay socket (see the module contract); no-op without one."""
        if self.replay is None:
            if self._suspect and self.state.expected is not None:
                # batches published while we were away are lost and nothing can tell which
                self.stats.unfilled += 1
                self._emit(self.state.clear())
            self._suspect = False
            return
        self._dups = {}
        # vLLM's ROUTER drops replies past its send high-water mark: a replay cut short is
        # resumed from where it stopped, a few rounds at most (then the next live batch or
        # probe carries on).
        got: list[tuple[int, bytes]] = []
        for _ in range(self.REPLAY_ROUNDS):
            start = self.state.replay_from
            del got[:]  # (one round's replies at a time: a round holds up to the caps)
            got, complete = await self._fetch(start)
            if not got and not complete:
                return  # no answer
            self._suspect = False
            self._dups.update((seq, hash(payload)) for seq, payload in got)
            if self.state.expected is not None:
                if not (got and self.state.is_anchor(*got[0])):
                    if got and got[0][0] > start:
                        self.stats.unfilled += 1
                    else:
                        self.stats.restarts += 1
                    self._emit(self.state.clear())
                    continue  # the state is fresh: the next round asks from 0
                got = got[1:]
            if await self._replayed(got) and complete:
                return

    async def _replayed(self, got: list[tuple[int, bytes]]) -> bool:
        """Apply replayed batches in order; ``False`` at a hole (a reply the ROUTER dropped),
        leaving the state at the last batch before it. Yields every ``TURN_S``: nothing
        else touches the state meanwhile (live batches wait in the socket)."""
        until = time.monotonic() + self.TURN_S
        for seq, payload in got:
            if time.monotonic() > until:
                await asyncio.sleep(0)
                until = time.monotonic() + self.TURN_S
            kind = self.state.check(seq)
            if kind is SeqCheck.BEHIND:
                continue
            if kind is SeqCheck.GAP:
                return False
            await self._apply(seq, payload)
        return True

    async def _fetch(self, start: int) -> tuple[list[tuple[int, bytes]], bool]:
        """(buffered batches with ``seq >= start``, whether the end marker came): one capped
        request (``bridge.replay``), with the engine's CURVE keys when it has them."""
        return await fetch(self.ctx, self.replay, start,  # type: ignore[arg-type]
                           self.replay_timeout, self.stats,
                           setup=None if self.curve is None else self.curve.apply)


def _recv(sub: zmq.Socket) -> list[bytes]:
    """``sub.recv_multipart(zmq.NOBLOCK)``, in half its CPU: a frame's ``more`` flag instead
    of a ``RCVMORE`` option call per frame (a message's frames arrive together, so only the
    first can raise ``zmq.Again``)."""
    frame = sub.recv(zmq.NOBLOCK, copy=False)
    parts = [frame.bytes]
    while frame.more:
        frame = sub.recv(zmq.NOBLOCK, copy=False)
        parts.append(frame.bytes)
    return parts
