"""The two adapters of the index link, driven the same way: a kvmesh worker (a tiny engine
whose pool makes the events) and a bridge rank (an ``EngineState`` fed vLLM batches)."""
from __future__ import annotations

import asyncio
from typing import Any

from bridge.engine_state import EngineState
from bridge.link import EngineLink
from kvmesh.events import vllm as ve
from kvmesh.hashing import none_hash
from kvmesh.link import Link

BS = 4


class WorkerSide:
    """``worker.index_link.ServiceLink`` over a tiny engine."""

    name = "worker"

    def __init__(self) -> None:
        from worker import Engine
        from worker.engine.async_engine import AsyncEngine
        self.runner = AsyncEngine(Engine.from_pretrained("tiny", block_size=BS,
                                                         num_blocks=4096)).start()
        self.seen = 0  # the last event seq that reached the link
        self.link: Link

    def make(self, addresses: list[str], *, max_pending: int | None = None,
             **opts: Any) -> Link:
        from worker.index_link import ServiceLink
        if max_pending is not None:
            opts["max_pending_blocks"] = max_pending
        self.link = link = ServiceLink(addresses, self.runner, worker_id="w0",
                                       address="127.0.0.1:1", model="tiny",
                                       root_hash=none_hash(), **opts)
        queue = link.queue

        def seen(events: list) -> None:  # what reached the link, queued or not
            if events:
                self.seen = events[-1].seq
            queue(events)
        link.queue = seen
        return link

    async def produce(self, r: int, n: int = 10) -> None:
        """``n`` requests of round ``r``, two full blocks each; returns once their events
        reached the link (the engine thread collects them after its jobs)."""
        batch = [[r, i, 5, 6, 7, 8, 9, 10, 11] for i in range(n)]
        last = await self.runner.call(lambda e: (e.generate(batch, max_tokens=1),
                                                 e.kv.pool.last_seq)[1])
        while self.seen < last:
            await asyncio.sleep(0.002)

    @property
    def seq(self) -> int:
        return self.runner.engine.kv.pool.last_seq

    def close(self) -> None:
        self.runner.stop()


class BridgeSide:
    """``bridge.link.EngineLink`` over an ``EngineState`` (no metrics: an empty load)."""

    name = "bridge"

    def __init__(self) -> None:
        self.state = EngineState(block_size=BS)
        self.link: Link

    def make(self, addresses: list[str], *, max_pending: int | None = None,
             **opts: Any) -> Link:
        if max_pending is not None:
            opts["max_pending"] = max_pending
        self.link = EngineLink(addresses, self.state, None, worker_id="w0",
                               address="127.0.0.1:1", model="tiny", root_hash=none_hash(),
                               **opts)
        return self.link

    async def produce(self, r: int, n: int = 10) -> None:
        """``n`` two-block chains of round ``r``, one engine batch each, to the link."""
        for i in range(n):
            first = 1 + 2 * (r * 1000 + i)
            tokens = [r, i, 5, 6, 7, 8, 9, 10]
            stored = ve.VllmStored(block_hashes=[first, first + 1], parent_block_hash=None,
                                   token_ids=tokens, block_size=BS, lora_id=None,
                                   medium=None, lora_name=None)
            out = self.state.apply(ve.KVEventBatch(ts=1.0, events=[stored],
                                                   data_parallel_rank=0))
            self.link.on_events(out)

    @property
    def seq(self) -> int:
        return self.state.out_seq

    def close(self) -> None:
        pass


async def truth(link: Link) -> tuple[int, set[tuple[bytes, int]]]:
    """(seq, (hash, tier) of every block) as the side's own snapshot tells it."""
    seq, blocks = await link.feed.snapshot()
    return seq, {(h, run.tier) for run in blocks for h in run.block_hashes}


SIDES = {"worker": WorkerSide, "bridge": BridgeSide}
