"""Drive an ``Engine`` from asyncio: many concurrent requests, one stepping thread.

The engine is not thread-safe, so only the engine thread touches it: ``submit`` and
``abort`` post to an inbox that the thread drains before each step, and each step's tokens
go back to the waiting coroutines through ``loop.call_soon_threadsafe``. Torch releases the
GIL inside its kernels, so the event loop (gRPC, heartbeats) stays responsive while a step
runs.
"""
from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from worker.engine import Engine, RequestError, StepOutput
from worker.sequence import SamplingParams, Seq


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
        self.error: BaseException | None = None
        self.load: dict[str, int] = engine.load()  # refreshed by the engine thread

    def start(self) -> AsyncEngine:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10)

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
                       salt: str | None = None, lora=None, mm=()) -> AsyncIterator[StepOutput]:
        """Yield this request's step outputs until it finishes. Raises ``RequestError``
        (validated on the caller's side first, so a bad request never reaches the thread).
        Cancelling the consumer aborts the request and frees its blocks."""
        prompt = [int(t) for t in prompt]  # a fresh list the engine then owns
        self.engine.validate(prompt, params)
        if request_id in self._streams:
            raise RequestError(f"request id {request_id!r} is already running")
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        self._streams[request_id] = stream

        def add(engine: Engine) -> None:
            stream.seq = engine.enqueue(prompt, params, request_id=request_id, salt=salt,
                                        lora=lora, mm=mm)

        try:
            await self.call(add)
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    return
        finally:
            self._streams.pop(request_id, None)
            if stream.seq is not None and stream.seq.finish_reason is None:
                seq = stream.seq
                self._inbox.put(lambda: self.engine.abort(seq))
                self._wake.set()

    def _run(self) -> None:
        while not self._stop:
            while True:
                try:
                    self._inbox.get_nowait()()
                except queue.Empty:
                    break
            if not self.engine.has_work():
                self.load = self.engine.load()
                if self.on_step is not None:
                    self.on_step(self.engine)
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except BaseException as exc:  # a broken step fails its requests, not the worker
                self.error = exc
                self._fail_all(exc)
                continue
            for out in outputs:
                stream = self._streams.get(out.seq_id)
                if stream is not None and (out.new_token_ids or out.finished):
                    stream.loop.call_soon_threadsafe(stream.queue.put_nowait, out)
            self.load = self.engine.load()
            if self.on_step is not None:
                self.on_step(self.engine)

    def _fail_all(self, exc: BaseException) -> None:
        for seq in list(self.engine.scheduler.running) + list(self.engine.scheduler.waiting):
            self.engine.abort(seq)
            stream = self._streams.get(seq.seq_id)
            if stream is not None:
                stream.loop.call_soon_threadsafe(stream.queue.put_nowait, exc)


def _set_result(fut: asyncio.Future, res: Any) -> None:
    if not fut.done():
        fut.set_result(res)


def _set_exception(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
