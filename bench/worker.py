"""`kvmesh bench worker`: what a prefix-cache hit saves on one worker, and decode costs.

All comparisons run in one process on the same engine and data, interleaved, and are
reported as ratios (shared machines are noisy):

- TTFT of a 2,048-token prompt whose first 1,792 tokens are cached, over the same prompt
  uncached (ideal ~ 256/2048 = 0.125 plus fixed costs).
- Decode of 8 sequences of 1,024 tokens: the paged attention op over plain SDPA on
  contiguous K/V (same values), then the whole model step with paged vs contiguous attention.
- Prefill and decode throughput of the model, tokens/s.
"""
from __future__ import annotations

import json
import random
import statistics
import time
from contextlib import contextmanager

import typer

from bench.timing import median_s


def ttft_ratio(engine, prompt_len: int = 2048, cached: int = 1792, repeats: int = 5) -> dict:
    rng = random.Random(0)
    prompt = [rng.randrange(256) for _ in range(prompt_len)]
    primer = prompt[:cached] + [(t + 1) % 256 for t in prompt[cached:cached + 16]]
    cold, warm = [], []
    for _ in range(repeats):
        assert engine.kv.reset_prefix_cache()
        cold.append(engine.generate([prompt], max_tokens=1)[0].ttft_s)
        assert engine.kv.reset_prefix_cache()
        engine.generate([primer], max_tokens=1)
        hit = engine.generate([prompt], max_tokens=1)[0]
        assert hit.num_cached_tokens == cached, hit.num_cached_tokens
        warm.append(hit.ttft_s)
    c, w = statistics.median(cold), statistics.median(warm)
    return {"ttft_uncached_ms": c * 1e3, "ttft_cached_ms": w * 1e3, "ttft_ratio": w / c}


def _decode_batch(engine, batch: int, ctx: int):
    """Sequences of ``ctx`` tokens whose first ctx-1 are in the cache, in shuffled blocks."""
    import torch

    from worker.model import AttentionMetadata

    bs = engine.block_size
    per = -(-ctx // bs)
    ids = list(range(batch * per))
    random.Random(1).shuffle(ids)
    rows = [(ids[i * per:(i + 1) * per], ctx - 1, 1) for i in range(batch)]
    meta = AttentionMetadata.build(rows, bs, engine.device)
    g = torch.Generator().manual_seed(0)
    engine.kv_cache.copy_(torch.randn(engine.kv_cache.shape, generator=g) * 0.5)
    return rows, meta


@contextmanager
def _contiguous_attention(model, kv_cache, rows, block_size: int, ctx: int):
    """Swap the model's paged attention for SDPA over contiguous per-layer K/V copies."""
    import torch
    import torch.nn.functional as F

    from worker.model import llama

    blocks = torch.tensor([r[0] for r in rows])
    layers = {}
    for i in range(kv_cache.shape[0]):
        k, v = kv_cache[i, 0], kv_cache[i, 1]
        def flat(c):
            return c[blocks].flatten(1, 2)[:, :ctx].transpose(1, 2).contiguous()
        layers[k.data_ptr()] = (flat(k), flat(v))

    def attend(q, k, v, k_cache, v_cache, meta, scale=None):
        kc, vc = layers[k_cache.data_ptr()]
        kc[:, :, ctx - 1] = k
        vc[:, :, ctx - 1] = v
        return F.scaled_dot_product_attention(q.unsqueeze(2), kc, vc, scale=scale,
                                              enable_gqa=True).squeeze(2)

    saved = llama.paged_attention
    llama.paged_attention = attend
    try:
        yield layers
    finally:
        llama.paged_attention = saved


def decode_ratios(engine, batch: int = 8, ctx: int = 1024, repeats: int = 20) -> dict:
    import torch
    import torch.nn.functional as F

    from worker.model import paged_attention

    model, cfg = engine.model, engine.config
    rows, meta = _decode_batch(engine, batch, ctx)
    heads, kvh, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    g = torch.Generator().manual_seed(2)
    q = torch.randn(batch, heads, hd, generator=g)
    k = torch.randn(batch, kvh, hd, generator=g)
    v = torch.randn(batch, kvh, hd, generator=g)
    kc, vc = engine.kv_cache[0, 0], engine.kv_cache[0, 1]
    with _contiguous_attention(model, engine.kv_cache, rows, engine.block_size, ctx) as layers:
        ck, cv = layers[kc.data_ptr()]
    ck[:, :, ctx - 1], cv[:, :, ctx - 1] = k, v

    def op_paged():
        return paged_attention(q, k, v, kc, vc, meta)

    def op_contig():
        return F.scaled_dot_product_attention(q.unsqueeze(2), ck, cv, enable_gqa=True)

    assert torch.allclose(op_paged(), op_contig().squeeze(2), atol=1e-4)
    ids = torch.randint(0, cfg.vocab_size, (batch,), generator=g)

    @torch.inference_mode()
    def step():
        h = model(ids, meta.positions, meta, engine.kv_cache)
        return model.compute_logits(h[meta.last_token_indices])

    paged_op = contig_op = paged_step = contig_step = 0.0
    for _ in range(3):  # interleave rounds so both sides see the same machine load
        paged_op += median_s(op_paged, repeats)
        contig_op += median_s(op_contig, repeats)
        paged_step += median_s(step, repeats)
        with _contiguous_attention(model, engine.kv_cache, rows, engine.block_size, ctx):
            contig_step += median_s(step, repeats)
    return {"decode_op_paged_ms": paged_op / 3 * 1e3, "decode_op_contig_ms": contig_op / 3 * 1e3,
            "decode_op_ratio": paged_op / contig_op,
            "decode_step_paged_ms": paged_step / 3 * 1e3,
            "decode_step_contig_ms": contig_step / 3 * 1e3,
            "decode_step_ratio": paged_step / contig_step}


def throughput(engine, prefill_prompts: int = 4, prompt_len: int = 1024,
               decode_seqs: int = 32, decode_tokens: int = 32) -> dict:
    rng = random.Random(3)
    assert engine.kv.reset_prefix_cache()
    prompts = [[rng.randrange(256) for _ in range(prompt_len)] for _ in range(prefill_prompts)]
    t0 = time.perf_counter()
    engine.generate(prompts, max_tokens=1)
    prefill = prefill_prompts * prompt_len / (time.perf_counter() - t0)
    prompts = [[rng.randrange(256) for _ in range(64)] for _ in range(decode_seqs)]
    engine.generate(prompts, max_tokens=1)  # warm the cache so the timed part is decode
    t0 = time.perf_counter()
    engine.generate(prompts, max_tokens=decode_tokens + 1, ignore_eos=True)
    decode = decode_seqs * decode_tokens / (time.perf_counter() - t0)
    return {"prefill_tokens_per_s": prefill, "decode_tokens_per_s": decode}


def run(model: str = "tiny", threads: int = 1, repeats: int = 5) -> dict:
    import torch

    from worker import Engine

    torch.set_num_threads(threads)
    engine = Engine.from_pretrained(model, block_size=16, num_blocks=1024)
    engine.generate([[1, 2, 3] * 40], max_tokens=2)  # warm-up
    out = {"model": model, "threads": threads}
    out.update(ttft_ratio(engine, repeats=repeats))
    out.update(decode_ratios(engine, repeats=repeats * 4))
    out.update(throughput(engine))
    return out


def register(bench: typer.Typer) -> None:
    @bench.command("worker")
    def worker(model: str = typer.Option("tiny"),
               threads: int = typer.Option(1, help="torch threads (1 is steadiest here)"),
               repeats: int = typer.Option(5),
               as_json: bool = typer.Option(False, "--json")) -> None:
        """Prefix-cache TTFT ratio, paged vs contiguous decode, throughput."""
        res = run(model, threads, repeats)
        if as_json:
            print(json.dumps(res))
            return
        from rich.console import Console
        from rich.table import Table

        t = Table(title=f"worker ({model}, {threads} thread(s))")
        t.add_column("measure")
        t.add_column("value", justify="right")
        t.add_column("goal", justify="right")
        t.add_row("TTFT 2,048 tok, uncached", f"{res['ttft_uncached_ms']:.1f} ms", "")
        t.add_row("TTFT 2,048 tok, 1,792 cached", f"{res['ttft_cached_ms']:.1f} ms", "")
        t.add_row("TTFT ratio cached/uncached", f"{res['ttft_ratio']:.3f}", "<= 0.25 (0.20)")
        t.add_row("decode op 8x1024, paged/contiguous", f"{res['decode_op_ratio']:.2f}x",
                  "<= 1.5x")
        t.add_row("decode step 8x1024, paged/contiguous", f"{res['decode_step_ratio']:.2f}x",
                  "<= 1.2x")
        t.add_row("prefill throughput", f"{res['prefill_tokens_per_s']:,.0f} tok/s", "")
        t.add_row("decode throughput (32 seqs)", f"{res['decode_tokens_per_s']:,.0f} tok/s", "")
        Console().print(t)
