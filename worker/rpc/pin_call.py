"""One ``WorkerService.Pin`` call: a checked request, and how it runs on the engine thread.

A pin names its prefix by token ids (with salt, LoRA and multimodal items, hashed here as a
request's prompt would be) or by its chain of block hashes, never both. ``warm`` asks the
worker to hold the whole prefix first: it runs the prefix as a one-token request through
the engine (cache hits and onboarded blocks are reused, the rest is prefilled), then pins.
``Engine.pin`` / ``Engine.unpin`` run on the engine thread (``AsyncEngine.call``), between
steps, like every other touch of the engine; they return the blocks pinned / unpinned.
"""
from __future__ import annotations

import math
import uuid
from dataclasses import dataclass

from kvmesh.hashing import Lora, MMItem
from kvmesh.v1 import worker_pb2
from worker.engine.async_engine import AsyncEngine
from worker.engine.sequence import SamplingParams
from worker.rpc.prompt_keys import prompt_keys

DEFAULT_TTL_S = 600.0  # a Pin without ttl_s (the service always sends its own)


@dataclass(frozen=True)
class PinCall:
    token_ids: tuple[int, ...]
    salt: str | None
    lora: Lora | None
    mm: tuple[MMItem, ...]
    block_hashes: tuple[bytes, ...] | None
    ttl_s: float
    warm: bool
    unpin: bool

    def _prefix(self) -> dict:
        return dict(token_ids=list(self.token_ids) or None, salt=self.salt, lora=self.lora,
                    mm=self.mm, block_hashes=list(self.block_hashes or ()) or None)

    async def apply(self, runner: AsyncEngine) -> int:
        """Warm (if asked), then pin or unpin on the engine thread; the blocks affected.
        Raises ``StepFailed`` when the warming request's step failed."""
        prefix = self._prefix()
        if self.unpin:
            return await runner.call(lambda engine: engine.unpin(**prefix))
        if self.warm and self.token_ids:
            await self._warm(runner)
        return await runner.call(lambda engine: engine.pin(**prefix, ttl_s=self.ttl_s))

    async def _warm(self, runner: AsyncEngine) -> None:
        stream = runner.generate(list(self.token_ids), SamplingParams(max_tokens=1,
                                                                       ignore_eos=True),
                                 request_id=f"pin-warm-{uuid.uuid4().hex[:12]}",
                                 salt=self.salt, lora=self.lora, mm=self.mm)
        async for _ in stream:
            pass


def pin_call(request: worker_pb2.PinRequest, max_mm_items: int) -> PinCall:
    """The checked call; raises ``ValueError`` (INVALID_ARGUMENT) for a request naming no
    prefix or two, extra keys next to block hashes, or a TTL that is not a finite number of
    seconds >= 0 (0: :data:`DEFAULT_TTL_S`)."""
    lora, mm = prompt_keys(request, max_mm_items)
    tokens, hashes = tuple(request.token_ids), tuple(request.block_hashes)
    if bool(tokens) == bool(hashes):
        raise ValueError("give the prefix as token_ids or as block_hashes (exactly one)")
    if hashes and (request.salt or lora is not None or mm):
        raise ValueError("block_hashes already carry the salt, LoRA and multimodal items: "
                         "leave those unset")
    if hashes and len({len(h) for h in hashes}) != 1:
        raise ValueError("block_hashes must all have one size")
    if not (math.isfinite(request.ttl_s) and request.ttl_s >= 0):
        raise ValueError(f"ttl_s ({request.ttl_s}) must be a finite number of seconds >= 0")
    return PinCall(tokens, request.salt or None, lora, mm, hashes or None,
                   request.ttl_s or DEFAULT_TTL_S, request.warm, request.unpin)
