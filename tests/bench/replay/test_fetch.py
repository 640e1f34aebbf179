"""Peer fetch in the replay: the import into a real manager, and rows with and without it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench.replay.fetch import FetchCost, held, pull
from bench.replay.replay import ReplayConfig, make_cluster, make_router, run
from bench.replay.rows import parse_row
from bench.replay.trace import CHUNK_TOKENS, TokenSynth, TraceRequest, load_trace
from kvmesh.events.pool import PoolStored
from tests.bench.replay.test_replay import cli
from tests.bench.replay.test_rows import same_figures
from worker.kv_cache import KVCacheManager, KVRequest

BS = 16
CFG = ReplayConfig(workers=4, block_size=BS, capacity_blocks=2000)


def chain_request(synth: TokenSynth, ids: tuple[int, ...], rid: str = "r") -> KVRequest:
    tr = TraceRequest(0, 0.0, len(ids) * CHUNK_TOKENS, 4, ids)
    return KVRequest(rid, synth.tokens(tr), block_hashes=synth.chain(tr),
                     num_prompt_tokens=tr.input_length)


def compute(kv: KVCacheManager, req: KVRequest) -> None:
    """Admit ``req`` as the engine would (its prompt computed and cached), then free it."""
    hits, n = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, req.num_tokens - n, hits, n) is not None
    kv.free(req)


def test_pull_imports_what_the_source_holds_beyond_the_destination() -> None:
    synth = TokenSynth(BS)
    source, dest = KVCacheManager(400, BS), KVCacheManager(400, BS)
    compute(source, chain_request(synth, (0, 1, 2)))     # 96 blocks
    compute(dest, chain_request(synth, (0,), "own"))      # its own first 32
    dest.take_events(), source.take_events()
    req = chain_request(synth, (0, 1, 2, 3))
    assert pull(dest, source, req, 120) == (32, 64)  # the source holds 96 of the 120 asked
    assert source.take_events() == []  # the source is read, not changed
    stored = [e for e in dest.take_events() if isinstance(e, PoolStored)]
    assert [h for e in stored for h in e.block_hashes] == req.block_hashes[32:96]
    # afterwards a hit like a local one: verified content, free (evictable) blocks
    hits, n = dest.get_computed_blocks(req)
    assert n == 96 * BS and all(b.ref_cnt == 0 for b in hits)
    assert dest.num_free_blocks == 400
    assert pull(dest, source, req, 120) == (96, 0)  # nothing left to import


def test_pull_imports_only_what_fits() -> None:
    synth = TokenSynth(BS)
    source, dest = KVCacheManager(400, BS), KVCacheManager(60, BS)
    compute(source, chain_request(synth, (0, 1)))
    busy = chain_request(synth, (7,), "busy")  # 32 blocks held by a running request
    hits, n = dest.get_computed_blocks(busy)
    assert dest.allocate_slots(busy, busy.num_tokens, hits, n) is not None
    req = chain_request(synth, (0, 1, 2))
    assert pull(dest, source, req, 64) == (0, 28)
    assert len(held(dest, req, 64)) == 28


def busy_holder_trace(path: Path, n: int = 24) -> Path:
    """Every request shares an 8-chunk (4,096-token) prefix and adds its own chunk; they
    arrive faster than one worker prefills them, so the holder is soon busy."""
    lines = [json.dumps({"timestamp": i * 40, "input_length": 9 * CHUNK_TOKENS - 7,
                         "output_length": 20, "hash_ids": [*range(8), 100 + i]})
             for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_busy_holder_makes_another_worker_fetch(tmp_path: Path) -> None:
    reqs = load_trace(busy_holder_trace(tmp_path / "hot.jsonl"))
    plain, fetch, oracle = run(reqs, ["kvmesh", "kvmesh+fetch", "oracle"], CFG)
    assert plain.requests == fetch.requests == len(reqs) and fetch.rejected == 0
    assert plain.fetches.fetches == 0 and "peer" not in plain.hit_by_tier
    assert fetch.fetches.fetches > 0 and fetch.fetches.blocks >= 4 * fetch.fetches.fetches
    peer = fetch.hit_by_tier["peer"]
    assert 0 < peer <= fetch.fetches.blocks * BS
    assert sum(fetch.hit_by_tier.values()) == fetch.hit_tokens
    assert fetch.prefill_tokens == fetch.prompt_tokens - fetch.hit_tokens
    # the prefix is computed once, not once per worker: the pooled cache's hit rate
    assert fetch.token_hit_rate > plain.token_hit_rate
    assert fetch.token_hit_rate == pytest.approx(oracle.token_hit_rate, abs=0.01)
    assert fetch.ttft_s() < plain.ttft_s()
    line = fetch.summary()
    assert (line["peer_tokens"], line["fetches"]) == (peer, fetch.fetches.fetches)


def test_a_fetch_row_that_never_fetches_is_the_plain_row(small_trace: Path,
                                                        tmp_path: Path) -> None:
    """The fetch plumbing (loads reporting peer_fetch and costs, the option ranked) changes
    nothing unless a fetch is made: the same figures as the policy without fetch."""
    never = ReplayConfig(workers=4, block_size=BS, capacity_blocks=2000,
                         min_fetch_blocks=10**6)
    for reqs in (load_trace(small_trace), load_trace(busy_holder_trace(tmp_path / "h.jsonl"))):
        plain, fetch = run(reqs, ["kvmesh", "kvmesh+fetch"], never)
        assert fetch.fetches.fetches == 0 and fetch.fetches.planned_blocks == 0
        assert same_figures(plain, fetch)
        assert plain.hit_by_tier == fetch.hit_by_tier


def test_only_fetch_rows_report_peer_fetch() -> None:
    plain, fetch = make_cluster("kvmesh", CFG), make_cluster("kvmesh+fetch", CFG)
    assert not plain[0].load(0.0).peer_fetch
    load = fetch[0].load(0.0)
    cost = FetchCost.of(CFG.cost.block_bytes(BS))
    assert load.peer_fetch and load.fetch_us_per_block == pytest.approx(cost.block_s * 1e6)
    assert load.prefill_us_per_token == pytest.approx(CFG.cost.prefill_s_per_token * 1e6)
    router = make_router("kvmesh+fetch", CFG, TokenSynth(BS), lambda: None)  # type: ignore
    assert router.policy.fetch.enabled and router.policy.fetch.min_fetch_blocks == 4


def test_fetch_rows_are_kvmesh_only() -> None:
    assert parse_row("kvmesh[queue_weight=0.5]+fetch").label == "kvmesh[queue_weight=0.5]+fetch"
    for bad in ("round_robin+fetch", "kvmesh+fetch@HEAD"):
        with pytest.raises(ValueError):
            parse_row(bad)


def test_cli_peer_fetch_adds_the_row_and_its_columns(tmp_path: Path) -> None:
    trace = busy_holder_trace(tmp_path / "hot.jsonl")
    out = CliRunner().invoke(cli(), ["bench", "replay", str(trace), "--workers", "4",
                                     "--capacity-blocks", "2000", "--json", "--peer-fetch",
                                     "--min-fetch-blocks", "8", "--policy", "kvmesh,oracle",
                                     "--fetch-us-per-block", "2000"])
    assert out.exit_code == 0, out.output
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    assert [x["policy"] for x in lines] == ["kvmesh", "kvmesh+fetch", "oracle"]
    assert lines[0]["fetches"] == 0
    # 2,000 us a block is 2.5x its recompute (800 us): no fetch is worth it
    assert lines[1]["fetches"] == 0 and lines[1]["token_hit_rate"] == lines[0]["token_hit_rate"]
