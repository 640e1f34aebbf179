"""Drive an ``Engine`` from asyncio: many concurrent requests, one stepping thread.

The engine is not thread-safe, so only the engine thread touches it: ``submit`` and
``abort`` post to an inbox that the thread drains before each step, and each step's tokens
go back to the waiting coroutines through ``loop.call_soon_threadsafe``. Torch releases the
GIL inside its kernels, so the event loop (gRPC, heartbeats) stays responsive while a step
runs.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from kvmesh.quota import DEFAULT_TENANT
from worker.engine.engine import Engine, RequestError, StepFailed, StepOutput
from worker.engine.sequence import SamplingParams, Seq

log = logging.getLogger("kvmesh.worker.engine")


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    seq: Seq | None = None


class AsyncEngine:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = False
        self._streams: dict[str, _Stream] = {}
        self._thread = threading.Thread(target=self._run, name="kvmesh-engine", daemon=True)
        self.on_step: Callable[[Engine], None] | None = None  # runs on the engine thread
        # ``error``: a failure that left the engine's state unknown (all requests failed);
        # health checks report it. A ``StepFailed`` is recovered from: only counted.
        self.error: BaseException | None = None
        self.failed_steps = 0
        self.last_step_error: StepFailed | None = None
        self.load: dict[str, int] = engine.load()  # refreshed by the engine thread

    def start(self) -> AsyncEngine:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10)
        self.engine.close()  # pending disk-tier writes land before the process ends

    def call(self, fn: Callable[[Engine], Any]) -> asyncio.Future:
        """Run ``fn(engine)`` on the engine thread between steps; await its result."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def job() -> None:
            try:
                res = fn(self.engine)
            except BaseException as exc:  # handed to the awaiting coroutine
                loop.call_soon_threadsafe(_set_exception, fut, exc)
            else:
                loop.call_soon_threadsafe(_set_result, fut, res)

        self._inbox.put(job)
        self._wake.set()
        return fut

    async def generate(self, prompt: list[int], params: SamplingParams, *, request_id: str,
                       salt: str | None = None, lora=None, mm=(), tenant: str = DEFAULT_TENANT,
                       on_enqueued: Callable[[Engine, Seq], None] | None = None,
                       ) -> AsyncIterator[StepOutput]:
        """Yield this request's step outputs until it finishes. Raises ``RequestError``
        (validated on the caller's side first, so a bad request never reaches the thread)
        and ``StepFailed`` (a step it was in failed; the engine serves on). Cancelling the
        consumer, even before the engine thread has enqueued the request, aborts it and
        frees its blocks. ``on_enqueued(engine, seq)`` runs on the engine thread right
        after the request is queued, before any step can admit it (a peer fetch's import);
        if it raises, the error is logged and the request runs without it."""
        prompt = [int(t) for t in prompt]  # a fresh list the engine then owns
        self.engine.validate(prompt, params)
        if request_id in self._streams:
            raise RequestError(f"request id {request_id!r} is already running")
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        self._streams[request_id] = stream

        def add(engine: Engine) -> None:
            stream.seq = engine.enqueue(prompt, params, request_id=request_id, salt=salt,
                                        lora=lora, mm=mm, tenant=tenant)
            if on_enqueued is not None:
                try:
                    on_enqueued(engine, stream.seq)
                except Exception:  # the request recomputes what the hook would have given
                    log.exception("request %s: work before its admission failed", request_id)

        def abort(engine: Engine) -> None:
            if stream.seq is not None:  # the inbox is FIFO: ``add`` has run by now
                engine.abort(stream.seq)

        finished = False
        try:
            await self.call(add)
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._streams.pop(request_id, None)
            if not finished:  # decided on the engine thread: ``add`` may not have run yet
                self._inbox.put(lambda: abort(self.engine))
                self._wake.set()

    def _run(self) -> None:
        while not self._stop:
            self._drain_inbox()
            if not self.engine.has_work():
                self.engine.settle_copies()  # a disk write failed while idle: not announced
                self._after_step()
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except StepFailed as exc:  # fails the step's requests, not the worker
                log.error("%s", exc, exc_info=exc.__cause__)
                self.failed_steps += 1
                self.last_step_error = exc
                self._fail(exc.seqs, exc)
                outputs = []
            except BaseException as exc:  # engine state unknown: fail everything queued
                log.critical("engine step failed outside its scope", exc_info=exc)
                self.error = exc
                sched = self.engine.scheduler
                seqs = list(sched.running) + list(sched.waiting)
                for seq in seqs:
                    self.engine.abort(seq)
                self._fail(seqs, exc)
                outputs = []
            for out in outputs:
                stream = self._streams.get(out.seq_id)
                if stream is not None and (out.new_token_ids or out.finished):
                    stream.loop.call_soon_threadsafe(stream.queue.put_nowait, out)
            self._after_step()  # after a failure too: its removal events go out at once

    def _drain_inbox(self) -> None:
        while True:
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                return
            try:
                job()
            except Exception:  # the thread must outlive any one job
                log.exception("engine-thread job failed")

    def _after_step(self) -> None:
        try:
            self.load = self.engine.load()
            if self.on_step is not None:
                self.on_step(self.engine)
        except Exception:  # a dead engine thread would hang every request
            log.exception("engine bookkeeping after a step failed")

    def _fail(self, seqs: list[Seq], exc: BaseException) -> None:
        """Hand ``exc`` to the streams of ``seqs`` (already finished by the engine)."""
        for seq in seqs:
            stream = self._streams.get(seq.seq_id)
            if stream is not None:
                stream.loop.call_soon_threadsafe(stream.queue.put_nowait, exc)


def _set_result(fut: asyncio.Future, res: Any) -> None:
    if not fut.done():
        fut.set_result(res)


def _set_exception(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
