"""`kvmesh bench kvcache`: the worker's KV block manager, per block, and the free queue's
O(1) touch.

1. One admission cycle of a 4,096-token request whose first half is cached (block size 16:
   256 blocks, 128 hits and 128 new ones): lookup (``get_computed_blocks``), allocation
   with caching of every new full block (``allocate_slots``), and ``free``. Reported in
   microseconds per block of the request, median over repeats, with and without hashing
   the request (hashing is what a worker pays once per request; the rest is the manager).
   The pool has 4x the request's blocks, so once it wraps, each cycle also evicts.
2. ``FreeBlockQueue`` touch (remove from the middle, then append back to the tail) at pool
   sizes 1K to 1M blocks on random blocks. It must not grow with the pool; the ratio 1M/1K
   is the figure to watch (what remains is the memory hierarchy, not the algorithm). A
   Python ``list.remove`` queue is shown beside it as the O(n) contrast.
"""
from __future__ import annotations

import json
import random
import statistics
import time

import typer

POOL_SIZES = (1_000, 10_000, 100_000, 1_000_000)


def admission_cycle(num_tokens: int = 4096, block_size: int = 16, repeats: int = 50,
                    vocab: int = 128_256, seed: int = 0) -> dict:
    """Median µs per block of lookup + allocate(+cache) + free, half the prefix cached."""
    from kvmesh.hashing import extend_block_hashes
    from worker.kv_cache import KVCacheManager, KVRequest

    rng = random.Random(seed)
    num_blocks = num_tokens // block_size
    m = KVCacheManager(num_blocks * 4, block_size)
    prefix = [rng.randrange(vocab) for _ in range(num_tokens // 2)]
    warm = KVRequest("warm", prefix + [0])
    hits, n = m.get_computed_blocks(warm)
    m.allocate_slots(warm, warm.num_tokens - n, hits, n)
    m.free(warm)

    phases: dict[str, list[float]] = {"lookup": [], "allocate": [], "free": [], "cycle": [],
                                      "cycle_with_hashing": []}
    for r in range(repeats):
        for hashed in (True, False):
            suffix = [rng.randrange(vocab) for _ in range(num_tokens - len(prefix))]
            req = KVRequest(f"r{r}{hashed}", prefix + suffix)
            if not hashed:
                extend_block_hashes(req.block_hashes, req.token_ids, block_size)
            t0 = time.perf_counter()
            hits, n = m.get_computed_blocks(req)
            t1 = time.perf_counter()
            new = m.allocate_slots(req, req.num_tokens - n, hits, n)
            t2 = time.perf_counter()
            m.free(req)
            t3 = time.perf_counter()
            assert n == len(prefix) and new is not None and len(new) == num_blocks - len(hits)
            if hashed:
                phases["cycle_with_hashing"].append(t3 - t0)
            else:
                phases["lookup"].append(t1 - t0)
                phases["allocate"].append(t2 - t1)
                phases["free"].append(t3 - t2)
                phases["cycle"].append(t3 - t0)
    row = {f"{k}_us_per_block": statistics.median(v) / num_blocks * 1e6
           for k, v in phases.items()}
    stats = m.stats
    row.update(num_tokens=num_tokens, block_size=block_size, blocks=num_blocks,
               cached_blocks=len(prefix) // block_size, repeats=repeats,
               evictions=stats.evictions, hit_rate=stats.hit_rate)
    return row


def free_queue_touch(sizes: tuple[int, ...] = POOL_SIZES, ops: int = 100_000,
                     rounds: int = 3, seed: int = 0) -> list[dict]:
    """ns per touch (remove from the middle) + append back, on random blocks."""
    from worker.kv_cache import FreeBlockQueue, KVCacheBlock

    rng = random.Random(seed)
    rows = []
    for n in sizes:
        blocks = [KVCacheBlock(i) for i in range(n)]
        queue = FreeBlockQueue(blocks)
        targets = [blocks[rng.randrange(n)] for _ in range(ops)]
        remove, append = queue.remove, queue.append
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for b in targets:
                remove(b)
                append(b)
            times.append(time.perf_counter() - t0)
        queue.check()
        naive = list(blocks)
        k = 200 if n <= 10_000 else 10
        t0 = time.perf_counter()
        for b in targets[:k]:
            naive.remove(b)
            naive.append(b)
        list_us = (time.perf_counter() - t0) / k * 1e6
        rows.append({"pool_blocks": n, "touch_ns": statistics.median(times) / ops * 1e9,
                     "list_remove_us": list_us})
        del blocks, queue, targets, naive
    return rows


def run(repeats: int = 50) -> dict:
    touch = free_queue_touch()
    by_size = {r["pool_blocks"]: r["touch_ns"] for r in touch}
    ratio = by_size[max(by_size)] / by_size[min(by_size)]
    return {"admission": admission_cycle(repeats=repeats), "free_queue": touch,
            "touch_ratio_largest_smallest": ratio}


def _print_tables(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    a = result["admission"]
    t1 = Table(title=f"KV block manager: {a['num_tokens']}-token request, block size "
                     f"{a['block_size']} ({a['blocks']} blocks, {a['cached_blocks']} cached), "
                     f"median of {a['repeats']}")
    t1.add_column("phase")
    t1.add_column("µs / block", justify="right")
    for key, label in (("lookup", "get_computed_blocks (verified hits)"),
                       ("allocate", "allocate_slots (touch, pop, cache)"),
                       ("free", "free (reverse order)"),
                       ("cycle", "whole cycle, hashes precomputed"),
                       ("cycle_with_hashing", "whole cycle incl. sha256_cbor hashing")):
        t1.add_row(label, f"{a[key + '_us_per_block']:.3f}")
    t2 = Table(title="FreeBlockQueue touch (remove from middle + append), random blocks")
    for col in ("pool blocks", "intrusive queue ns/touch", "list.remove µs/touch (O(n))"):
        t2.add_column(col, justify="right")
    for r in result["free_queue"]:
        t2.add_row(f"{r['pool_blocks']:,}", f"{r['touch_ns']:.0f}", f"{r['list_remove_us']:.1f}")
    console = Console()
    console.print(t1)
    console.print(t2)
    console.print(f"touch cost ratio 1M/1K blocks: {result['touch_ratio_largest_smallest']:.2f}x"
                  f" (pool grew 1000x)")


def register(bench: typer.Typer) -> None:
    @bench.command("kvcache")
    def kvcache(repeats: int = typer.Option(50, help="admission cycles to take the median of"),
                as_json: bool = typer.Option(False, "--json")) -> None:
        """KV block manager: µs per block of an admission cycle; O(1) free-queue touch."""
        result = run(repeats)
        if as_json:
            print(json.dumps(result))
            return
        _print_tables(result)
