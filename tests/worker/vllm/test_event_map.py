"""A kvmesh worker's KV events in vLLM's format, read back by the bridge's own code, describe
exactly the worker's cache: salts, LoRA, multimodal keys, duplicates, evictions, the CPU tier
and resets, step by step (no sockets: ``worker.vllm.publisher`` only frames these)."""
from __future__ import annotations

import random

import pytest

from bridge.engine_state import EngineState
from kvmesh.events import vllm as ve
from kvmesh.events.pool import PoolRemoved, PoolStored
from kvmesh.hashing import resolve_seed
from worker.engine.engine import Engine
from worker.engine.sequence import SamplingParams
from worker.kv_cache.tier_config import TierConfig
from worker.vllm.event_map import VllmEventMap, untagged

BS = 4
LORA = ("sql", "/adapters/sql")


class Pair:
    """An engine and the bridge state fed from its translated events, batch per step."""

    def __init__(self, *, as_int: bool = True, cpu_blocks: int = 0, num_blocks: int = 24):
        self.engine = Engine.from_pretrained("tiny", block_size=BS, num_blocks=num_blocks,
                                             device="cpu", tiers=TierConfig(cpu_blocks=cpu_blocks))
        self.map = VllmEventMap(BS, as_int=as_int)
        self.state = EngineState(block_size=BS, algo=self.engine.kv.hash_algo,
                                 seed=resolve_seed(self.engine.kv.hash_algo),
                                 loras={LORA[0]: LORA[1]})
        self.seq = 0
        self.kvmesh_events: list = []
        self.vllm_events: list = []

    def pump(self) -> None:
        events = self.engine.kv.take_events()
        self.kvmesh_events += events
        out = self.map.translate(self.engine.kv, events)
        if not out:
            return
        self.vllm_events += out
        payload = ve.encode_batch(ve.KVEventBatch(ts=0.0, events=out, data_parallel_rank=0))
        self.state.ingest(self.seq, payload)
        self.seq += 1

    def run(self, prompt: list[int], max_tokens: int = 3, **keys) -> None:
        self.engine.add_request(prompt, SamplingParams(max_tokens=max_tokens), **keys)
        while self.engine.has_work():
            self.engine.step()
            self.pump()

    def held(self) -> set[tuple[bytes, str]]:
        snap = self.engine.kv.cached_block_hashes()
        return {(h, t) for h, t in zip(snap.block_hashes, snap.tiers or
                                       [snap.tier] * len(snap.block_hashes), strict=True)}

    def bridged(self) -> set[tuple[bytes, str]]:
        return {(h, t) for h in self.state._held for t in self.state.held(h)}


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


@pytest.mark.parametrize("as_int", [True, False], ids=["int", "bytes"])
def test_the_bridge_sees_exactly_the_pool_through_salts_lora_mm_and_evictions(as_int):
    p = Pair(as_int=as_int)
    system = prompt(0, 4 * BS)
    p.run(system + prompt(1, 6))
    p.run(system + prompt(2, 9))                            # shares the system prompt
    p.run(system + prompt(3, 5), salt="tenant-a")           # same tokens, another chain
    p.run(system + prompt(4, 7), lora=LORA)
    p.run(prompt(5, 3 * BS + 1), mm=(("img-1", 2, 6),))     # multimodal keys on blocks 0-1
    assert p.bridged() == p.held() and p.held()
    for seed in range(6, 16):                               # fill the pool: evictions
        p.run(system + prompt(seed, 3 * BS), salt="tenant-b" if seed % 3 == 0 else None)
        assert p.bridged() == p.held()
    assert p.engine.kv.stats.evictions > 0 and p.map.unpublished == 0
    assert any(isinstance(e, PoolRemoved) for e in p.kvmesh_events)
    assert p.engine.kv.reset_prefix_cache()
    p.pump()
    assert p.bridged() == p.held() == set()


def test_duplicates_are_removed_once_per_copy_as_vllm_does():
    """Two greedy requests with one prompt decode the same tokens in lockstep, each into its
    own blocks (block tables are append-only): the generated blocks are cached twice. kvmesh
    removes such a hash once, vLLM once per copy: the map publishes every copy, so a consumer
    counting copies (the bridge) drops it exactly when the pool does."""
    p = Pair()
    same = prompt(7, 3 * BS + 1)
    for _ in range(2):
        p.engine.add_request(same, SamplingParams(max_tokens=2 * BS))
    while p.engine.has_work():
        p.engine.step()
        p.pump()
    stored = [h for e in p.vllm_events if isinstance(e, ve.VllmStored) for h in e.block_hashes]
    assert len(stored) > len(set(stored)), "the test needs duplicate copies"
    for seed in range(20, 40):  # evict everything
        p.run(prompt(seed, 5 * BS))
    removed = [h for e in p.vllm_events if isinstance(e, ve.VllmRemoved) for h in e.block_hashes]
    for h in set(stored) & set(removed):
        assert removed.count(h) == stored.count(h)
    assert p.bridged() == p.held()


def test_the_cpu_tier_is_published_with_its_medium():
    p = Pair(cpu_blocks=16, num_blocks=16)
    for seed in range(30, 40):
        p.run(prompt(seed, 3 * BS + 1), salt="s" if seed % 2 else None, max_tokens=2)
        assert p.bridged() == p.held()
    mediums = {e.medium for e in p.vllm_events if isinstance(e, ve.VllmStored)}
    assert mediums == {"GPU", "CPU"}
    assert {t for _, t in p.held()} == {"gpu", "cpu"}


def test_a_block_whose_keys_are_gone_is_left_out_with_its_removal():
    """Stored and dropped within one take (a failed step): its keys cannot be read back, so
    neither that block nor what chains from it nor their removal is published; a consumer
    may miss a block, never hold one the pool does not."""
    p = Pair()
    p.run(prompt(50, 2 * BS + 1))
    known = p.engine.kv.pool.snapshot().block_hashes[0]  # block 0 of that prompt
    gone, child = b"\x02" * 32, b"\x03" * 32
    tokens = prompt(50, 2 * BS + 1)[:BS] + list(range(2 * BS))
    out = p.map.translate(p.engine.kv, [
        PoolStored(99, [known, gone, child], None, tokens, "gpu"),
        PoolRemoved(100, [gone, child], "gpu")])
    assert p.map.unpublished == 2
    (stored,) = out  # the removal of what was never published is not published either
    assert isinstance(stored, ve.VllmStored)
    assert stored.block_hashes == [ve.external_hash(known)] and stored.token_ids == tokens[:BS]


def test_untagged_keys_are_vllms():
    keys = (("lora", "sql", "/p"), ("mm", "img", -3), ("mm", "img2", 0), ("cache_salt", "s"))
    assert untagged(keys) == ("sql", ("sql", ("img", -3), ("img2", 0), "s"))
    assert untagged(None) == (None, None)
    with pytest.raises(ValueError):
        untagged((("prompt_embeds", b"x"),))
