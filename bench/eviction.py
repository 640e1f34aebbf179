"""Layered eviction and automatic pinning vs vLLM's LRU: token hit rate of one worker's KV
manager on two workloads, in simulated steps (no model; the real ``KVCacheManager``).

Workloads: ``chat`` (histories reuse decode-generated blocks) and ``mooncake`` (outputs never
reused). The hit rate is the manager's own. Run: ``python -m bench.eviction [--quick] [--json]``.

See docs/architecture.md#end-to-end-and-serving-benches.
"""
from __future__ import annotations

import argparse
import json
import random
from collections import deque
from dataclasses import dataclass

from kvmesh.contract import EVICTIONS
from worker.kv_cache import KVCacheManager, KVRequest


@dataclass
class Job:
    """One request: prompt, how many tokens to generate, and what to do when it is done."""

    prompt: list[int]
    output: list[int]
    arrival: int
    conv: int = -1
    req: KVRequest | None = None
    done: int = 0  # output tokens generated so far


@dataclass
class Chat:
    """Synthetic multi-turn chat. Each conversation draws from its own random stream, so its
    turns are the same whatever order the simulation finishes them in."""

    convs: int = 200
    systems: int = 4
    system_len: int = 256
    turns: tuple[int, int] = (2, 8)
    user_len: tuple[int, int] = (30, 200)
    output_len: tuple[int, int] = (30, 300)
    think: tuple[int, int] = (20, 400)  # steps between a reply and the next turn
    gap: int = 40                       # steps between two conversations' starts
    seed: int = 0

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        self.sys = [_tokens(rng, self.system_len) for _ in range(self.systems)]
        self.rngs = [random.Random(self.seed * 1_000_003 + c + 1) for c in range(self.convs)]
        self.history: dict[int, list[int]] = {}
        self.left: dict[int, int] = {}

    def first_jobs(self) -> list[Job]:
        out = []
        for c, rng in enumerate(self.rngs):
            self.history[c] = list(rng.choice(self.sys))
            self.left[c] = rng.randint(*self.turns)
            out.append(self._turn(c, c * self.gap))
        return out

    def _turn(self, c: int, now: int) -> Job:
        rng = self.rngs[c]
        self.history[c] += _tokens(rng, rng.randint(*self.user_len))
        self.left[c] -= 1
        out = _tokens(rng, rng.randint(*self.output_len))
        return Job(list(self.history[c]), out, now, conv=c)

    def after(self, job: Job, now: int) -> Job | None:
        """The conversation's next turn (its prompt holds this reply), or None."""
        self.history[job.conv] += job.output
        if self.left[job.conv] <= 0:
            return None
        return self._turn(job.conv, now + self.rngs[job.conv].randint(*self.think))


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 32_000) for _ in range(n)]


def mooncake_jobs(path: str, limit: int, max_output: int, gap: int) -> list[Job]:
    from bench.replay.trace import chunk_tokens, load_trace

    rng = random.Random(1)
    return [Job(chunk_tokens(r.hash_ids, r.input_length).tolist(),
                _tokens(rng, min(r.output_length, max_output)), i * gap)
            for i, r in enumerate(load_trace(path, limit))]


def simulate(jobs: list[Job], num_blocks: int, block_size: int, *, eviction: str,
             auto_pin: bool, concurrency: int, chat: Chat | None = None) -> dict:
    """Run ``jobs`` (plus the turns ``chat`` makes) to completion; the manager's counters."""
    step = [0]
    m = KVCacheManager(num_blocks, block_size, eviction=eviction, auto_pin=auto_pin,
                       clock=lambda: step[0] / 100.0)  # 100 steps a second
    fits = [j for j in jobs if m.can_ever_fit(len(j.prompt) + len(j.output))]
    skipped = len(jobs) - len(fits)  # larger than the whole pool: never admitted
    pending_q = deque(sorted(fits, key=lambda j: j.arrival))
    later: list[Job] = []
    waiting: deque[Job] = deque()
    running: list[Job] = []
    n = 0
    while pending_q or later or waiting or running:
        now = step[0]
        later.sort(key=lambda j: j.arrival)
        while later and later[0].arrival <= now:
            waiting.append(later.pop(0))
        while pending_q and pending_q[0].arrival <= now:
            waiting.append(pending_q.popleft())
        with m.step():
            for job in list(running):  # decode one token each
                if job not in running:
                    continue  # preempted by an earlier one this step
                req = job.req
                req.token_ids.append(job.output[job.done])
                while m.allocate_slots(req, 1) is None:
                    victim = running.pop()
                    m.preempt(victim.req)
                    del victim.req.token_ids[len(victim.prompt) + victim.done:]
                    waiting.appendleft(victim)
                    if victim is job:
                        break
                if job in running:
                    req.num_computed_tokens += 1
                    job.done += 1
            while waiting and len(running) < concurrency:
                job = waiting[0]
                if job.req is None:
                    job.req = KVRequest(f"r{n}", list(job.prompt),
                                        num_prompt_tokens=len(job.prompt))
                    n += 1
                req = job.req
                hits, k = m.get_computed_blocks(req)
                if m.allocate_slots(req, req.num_tokens - k, hits, k) is None:
                    break
                req.num_computed_tokens = req.num_tokens
                running.append(waiting.popleft())
        for job in [j for j in running if j.done >= len(j.output)]:
            running.remove(job)
            m.free(job.req)
            nxt = chat.after(job, now) if chat is not None else None
            if nxt is not None:
                later.append(nxt)
        step[0] += 1
        if not running and not waiting:  # idle: jump to the next arrival
            arrivals = [j.arrival for j in later] + [j.arrival for j in list(pending_q)[:1]]
            if arrivals:
                step[0] = max(step[0], min(arrivals))
    s = m.stats
    return {"hit_rate": round(s.hit_rate, 4), "queries": s.queries, "hits": s.hits,
            "evictions": s.evictions, "requests": s.requests,
            "preempted": s.preempted_requests, "skipped": skipped}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller workloads")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--trace", default="../shared/traces/conversation_trace.jsonl")
    args = ap.parse_args()
    bs = 16
    convs = 80 if args.quick else 300
    for frac in (0.03, 0.1, 0.25, 0.5):
        # The chat working set: every conversation's final history, in blocks.
        probe = Chat(convs=convs)
        total = sum(len(j.prompt) for j in _all_turns(probe)) // bs
        blocks = max(64, int(total * frac))
        for eviction in EVICTIONS:
            for auto in (False, True):
                chat = Chat(convs=convs)
                r = simulate(chat.first_jobs(), blocks, bs, eviction=eviction,
                             auto_pin=auto, concurrency=16, chat=chat)
                _show({"workload": "chat", "pool_blocks": blocks, "pool_share": frac,
                       "eviction": eviction, "auto_pin": auto, **r}, args.json)
    limit = 300 if args.quick else 1000
    for blocks in (4_000, 12_000):
        for eviction in EVICTIONS:
            for auto in (False, True):
                jobs = mooncake_jobs(args.trace, limit, 512, gap=20)
                r = simulate(jobs, blocks, bs, eviction=eviction, auto_pin=auto,
                             concurrency=8)
                _show({"workload": f"mooncake[:{limit}]", "pool_blocks": blocks,
                       "eviction": eviction, "auto_pin": auto, **r}, args.json)


def _show(row: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(row), flush=True)
        return
    print(f"{row['workload']:>16} pool={row['pool_blocks']:>6} {row['eviction']:>8} "
          f"auto_pin={row['auto_pin']!s:>5} hit={row['hit_rate']:.4f} "
          f"evictions={row['evictions']} preempted={row['preempted']} "
          f"skipped={row['skipped']}", flush=True)


def _all_turns(chat: Chat) -> list[Job]:
    """Every final conversation history of ``chat`` (run without a cache: sizing only)."""
    last: dict[int, Job] = {}
    queue = deque(chat.first_jobs())
    while queue:
        job = queue.popleft()
        nxt = chat.after(job, 0)
        if nxt is None:
            last[job.conv] = Job(job.prompt + job.output, [], 0, job.conv)
        else:
            queue.append(nxt)
    return list(last.values())


if __name__ == "__main__":
    main()
