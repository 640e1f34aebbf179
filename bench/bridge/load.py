"""The load of ``kvmesh bench bridge``: vLLM-like engines publishing KV events at a set rate.

Its own process (its CPU is not the bridge's): per engine a PUB socket, a replay ROUTER and a
``/metrics`` page; commands on stdin (``warm``, ``run RATE SECONDS``, ``quit``), one JSON line
answered each.

See docs/architecture.md#index-route-and-bridge-benches.
"""
from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import typer
import zmq

from kvmesh.events import vllm as ve

VOCAB = 128_256
PAGE = ('vllm:num_requests_running{{engine="0",model_name="bench"}} 0\n'
        'vllm:num_requests_waiting{{engine="0",model_name="bench"}} 0\n'
        'vllm:kv_cache_usage_perc{{engine="0",model_name="bench"}} 0\n'
        'vllm:cache_config_info{{block_size="{bs}",engine="0",model_name="bench",'
        'num_gpu_blocks="1000000"}} 1\n')


class Publisher:
    """One engine: PUB + replay ROUTER served from a thread, seq from 0."""

    def __init__(self, ctx: zmq.Context) -> None:
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.SNDHWM, 100_000)
        self.pub.bind("tcp://127.0.0.1:*")
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.SNDHWM, 30_000)
        self.router.bind("tcp://127.0.0.1:*")
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=ve.REPLAY_BUFFER)
        self.lock = threading.Lock()
        self.seq = 0
        threading.Thread(target=self._replay, daemon=True).start()

    def endpoints(self) -> tuple[str, str]:
        return (self.pub.getsockopt_string(zmq.LAST_ENDPOINT),
                self.router.getsockopt_string(zmq.LAST_ENDPOINT))

    def publish(self, events: list) -> None:
        payload = ve.encode_batch(ve.KVEventBatch(ts=time.time(), events=events,
                                                  data_parallel_rank=0))
        with self.lock:
            seq, self.seq = self.seq, self.seq + 1
            self.buffer.append((seq, payload))
            self.pub.send_multipart(ve.pack_message(b"", seq, payload))

    def _replay(self) -> None:
        while True:
            ident, _, start = self.router.recv_multipart()
            with self.lock:
                batches = [b for b in self.buffer if b[0] >= int.from_bytes(start, "big")]
            for seq, payload in batches:
                self.router.send_multipart([ident, *ve.replay_reply(b"", seq, payload)])
            self.router.send_multipart([ident, *ve.replay_end()])


def _serve_pages(block_size: int) -> int:
    page = PAGE.format(bs=block_size).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("content-type", "text/plain")
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


class Steps:
    """The engines' batches, one per engine step, shaped as vLLM publishes them.

    vLLM's engine core publishes one ``KVEventBatch`` per scheduler step; its block pool
    appends one ``BlockStored`` per request whose blocks filled in the step (the request's
    new full blocks, chained) and one ``BlockRemoved`` per evicted block (a single hash).
    So a batch here is ``blocks`` new blocks split over ``requests`` fresh chains (unique
    hashes and contents; token ids Zipf-distributed over a 128k vocabulary, like text, or
    uniform), and
    once ``window`` batches of the engine are out, the removal of the batch that many
    earlier (the index stays bounded): one event per block, each chain tail first (vLLM
    frees a request's blocks in reverse order, so its tail is evicted first), or with
    ``bulk_removals`` one event for the whole batch (the shape earlier runs of this bench
    used). The default 128 blocks a step is 2,048 prefill tokens, within the per-step token
    budget vLLM's V1 engine sets by default (2,048 to 8,192 by GPU); 8 engines at 25,000
    blocks/s each then step ~195 times a second."""

    def __init__(self, engines: int, blocks: int = 128, requests: int = 4, block_size: int = 16,
                 window: int = 64, uniform: bool = False, bulk_removals: bool = False,
                 seed: int = 0) -> None:
        if not 1 <= requests <= blocks:
            raise ValueError(f"requests must be in [1, blocks], got {requests}")
        self.blocks, self.block_size, self.window = blocks, block_size, window
        self.uniform, self.bulk_removals = uniform, bulk_removals
        self.sizes = [blocks // requests + (r < blocks % requests) for r in range(requests)]
        self.rng = np.random.default_rng(seed)
        # drawing 2,048 Zipf ids costs ~0.3 ms: at 200,000 blocks/s that would be half a core
        # of this (shared) host; so batches are slices of a pool drawn once, each chain made
        # unique by a counter in its first two ids
        pool = 1 << 21
        self.pool = (self.rng.integers(0, VOCAB, pool) if uniform
                     else (self.rng.zipf(1.2, pool) - 1) % VOCAB)
        self.chains = itertools.count()
        self.hashes = itertools.count(10**9)  # the bench's probe engine uses small hashes
        self.sent: list[deque[list[list[int]]]] = [deque() for _ in range(engines)]

    def tokens(self, sizes: list[int]) -> list[int]:
        """Token ids for chains of ``sizes`` blocks, back to back; no two chains alike."""
        n = sum(sizes) * self.block_size
        at = int(self.rng.integers(0, len(self.pool) - n))
        out = self.pool[at:at + n].copy()
        start = 0
        for size in sizes:
            c = next(self.chains)
            out[start], out[start + 1] = c % VOCAB, c // VOCAB % VOCAB
            start += size * self.block_size
        return out.tolist()

    def batch(self, i: int) -> list:
        """Engine ``i``'s next batch of events."""
        bs, hashes = self.block_size, self.hashes
        tokens = self.tokens(self.sizes)
        chains = [[next(hashes) for _ in range(n)] for n in self.sizes]
        events: list = []
        at = 0
        for ids in chains:
            events.append(ve.VllmStored(block_hashes=ids, parent_block_hash=None,
                                        token_ids=tokens[at:at + len(ids) * bs],
                                        block_size=bs, lora_id=None, medium="GPU",
                                        lora_name=None))
            at += len(ids) * bs
        sent = self.sent[i]
        sent.append(chains)
        if len(sent) > self.window:
            old = sent.popleft()
            if self.bulk_removals:
                events.append(ve.VllmRemoved(block_hashes=[h for ids in old for h in ids],
                                             medium="GPU"))
            else:
                events += [ve.VllmRemoved(block_hashes=[h], medium="GPU")
                           for ids in old for h in reversed(ids)]
        return events


def main(engines: int = 8, blocks: int = 128, requests: int = 4, block_size: int = 16,
         window: int = 64, uniform: bool = False, bulk_removals: bool = False,
         seed: int = 0) -> None:
    ctx = zmq.Context.instance()
    pubs = [Publisher(ctx) for _ in range(engines)]
    port = _serve_pages(block_size)
    steps = Steps(engines, blocks, requests, block_size, window, uniform, bulk_removals, seed)
    batch = steps.batch

    info = {"metrics": f"http://127.0.0.1:{port}",
            "engines": [dict(zip(("events", "replay"), p.endpoints(), strict=True))
                        for p in pubs]}
    print(json.dumps(info), flush=True)
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "warm":
            for p in pubs:
                p.publish([])
            out: dict = {}
        elif cmd == "run":
            rate, seconds = float(args[0]), float(args[1])
            out = _run(pubs, batch, rate / blocks, seconds)
            out["stored_blocks"] = out["batches"] * blocks
        else:
            return
        print(json.dumps(out), flush=True)


def _run(pubs: list[Publisher], batch, batches_per_s: float, seconds: float) -> dict:
    """Publish on schedule; ``late_s``: how far behind its schedule the publisher fell."""
    start = time.monotonic()
    total = int(batches_per_s * seconds)
    late = 0.0
    for n in range(total):
        due = start + n / batches_per_s
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
        else:
            late = max(late, now - due)
        i = n % len(pubs)
        pubs[i].publish(batch(i))
    return {"batches": total, "seconds": time.monotonic() - start, "late_s": late}


if __name__ == "__main__":
    typer.run(main)
