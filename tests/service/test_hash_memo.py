"""BlockHashMemo returns exactly kvmesh.hashing.block_hashes, hit or miss, under eviction."""
from __future__ import annotations

import random
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvmesh.contract import ALGOS
from kvmesh.hashing import block_hashes
from service.hash_memo import BlockHashMemo


def _prompt(rng: random.Random, n: int, vocab: int = 50) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def test_repeated_prefix_is_served_from_the_memo() -> None:
    memo = BlockHashMemo()
    rng = random.Random(0)
    system = _prompt(rng, 64)
    a = system + _prompt(rng, 40)
    b = system + _prompt(rng, 40)
    assert memo.block_hashes(a, 16) == block_hashes(a, 16)
    assert (memo.hits, memo.misses) == (0, 6)
    assert memo.block_hashes(b, 16) == block_hashes(b, 16)
    assert (memo.hits, memo.misses) == (4, 8)  # the 4 system blocks were reused
    assert memo.block_hashes(b, 16) == block_hashes(b, 16)
    assert (memo.hits, memo.misses) == (10, 8)


def test_salt_seed_and_algo_are_part_of_the_key() -> None:
    memo = BlockHashMemo()
    toks = list(range(48))
    for algo in ALGOS:
        for seed in (None, "0"):
            for salt in (None, "tenant-a", "tenant-b", "é"):
                want = block_hashes(toks, 16, algo=algo, seed=seed, salt=salt)
                assert memo.block_hashes(toks, 16, algo=algo, seed=seed, salt=salt) == want
                assert memo.block_hashes(toks, 16, algo=algo, seed=seed, salt=salt) == want
    # block sizes that share a byte prefix never share entries
    assert memo.block_hashes(toks, 8) == block_hashes(toks, 8)
    assert memo.block_hashes(toks, 24) == block_hashes(toks, 24)


def test_salted_small_blocks_never_take_an_unsalted_large_block_entry() -> None:
    """The old key (root + packed tokens + salt bytes) of block 0 at block size 8 with a salt
    equal to the packed bytes of tokens 8..15 was the key of block 0 at block size 16."""
    toks = list(range(1, 17))  # each id < 128 packs to ASCII bytes: valid UTF-8 as a salt
    salt = struct.pack("<8q", *toks[8:]).decode()
    memo = BlockHashMemo()
    assert memo.block_hashes(toks, 16) == block_hashes(toks, 16)
    assert memo.block_hashes(toks[:8], 8, salt=salt) == block_hashes(toks[:8], 8, salt=salt)
    # and the other way round, on a fresh memo
    memo = BlockHashMemo()
    assert memo.block_hashes(toks[:8], 8, salt=salt) == block_hashes(toks[:8], 8, salt=salt)
    assert memo.block_hashes(toks, 16) == block_hashes(toks, 16)


def test_lora_is_part_of_the_key() -> None:
    memo = BlockHashMemo()
    toks = list(range(40))
    for lora in (None, ("ad", "/p"), ("a", "d/p"), ("ad", "/q"), ("", "")):
        for _ in range(2):
            want = block_hashes(toks, 16, lora=lora)
            assert memo.block_hashes(toks, 16, lora=lora) == want
    assert memo.hits == 5 * 2


def test_mm_short_and_out_of_range_prompts_bypass_the_memo() -> None:
    memo = BlockHashMemo()
    toks = list(range(40))
    mm = [("img", 3, 20)]
    assert memo.block_hashes(toks, 16, mm=mm) == block_hashes(toks, 16, mm=mm)
    assert memo.block_hashes(toks[:15], 16) == []
    big = [2**63] * 16  # beyond int64, still a CBOR uint
    assert memo.block_hashes(big, 16) == block_hashes(big, 16)
    assert len(memo) == 0


def test_memory_stays_bounded_and_recently_used_entries_survive() -> None:
    memo = BlockHashMemo(capacity=8)
    rng = random.Random(1)
    hot = _prompt(rng, 64)  # 4 blocks, used before every cold prompt
    for _ in range(20):
        cold = _prompt(rng, 96, vocab=10_000)
        assert memo.block_hashes(hot, 16) == block_hashes(hot, 16)
        assert memo.block_hashes(cold, 16) == block_hashes(cold, 16)
        assert len(memo) <= 16
    hits = memo.hits
    memo.block_hashes(hot, 16)
    assert memo.hits == hits + 4


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        BlockHashMemo(capacity=0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 60), st.sampled_from(
    [None, "s1", "s2"]), st.sampled_from(ALGOS)), min_size=1, max_size=12),
    st.integers(1, 6))
def test_any_sequence_of_calls_matches_the_reference(calls: list, capacity: int) -> None:
    """Prompts built from 4 shared stems plus random tails, tiny capacity (rotations)."""
    rng = random.Random(len(calls))
    stems = [_prompt(rng, 32, vocab=8) for _ in range(4)]
    memo = BlockHashMemo(capacity=capacity)
    for stem, tail, salt, algo in calls:
        toks = stems[stem] + _prompt(rng, tail, vocab=8)
        assert memo.block_hashes(toks, 4, algo=algo, salt=salt) == block_hashes(
            toks, 4, algo=algo, salt=salt)


def test_a_known_prompt_is_a_few_segment_lookups() -> None:
    """512 blocks known whole: 16 lookups of 32-block segments, none per block."""
    memo = BlockHashMemo()
    toks = np.array(_prompt(random.Random(2), 512 * 16, vocab=128_256), dtype=np.uint32)
    want = block_hashes(toks.tolist(), 16)
    assert memo.block_hashes(toks, 16) == want
    calls: list[int] = []
    for level in (memo._segments, memo._blocks):
        get = level.get
        level.get = lambda key, blocks=1, get=get: calls.append(blocks) or get(key, blocks)
    assert memo.block_hashes(toks, 16) == want
    assert calls == [32] * 16
    assert (memo.hits, memo.misses) == (512, 512)


def test_a_longer_turn_reuses_whole_segments_then_blocks() -> None:
    """A conversation's next turn: the earlier turn's whole segments, then the blocks of
    the segment where it grew, then new hashing."""
    memo = BlockHashMemo(segment_blocks=4)
    rng = random.Random(3)
    turn1 = _prompt(rng, 10 * 16, vocab=1000)       # segments [0,4) [4,8) [8,10)
    turn2 = turn1 + _prompt(rng, 5 * 16, vocab=1000)  # 15 blocks
    assert memo.block_hashes(turn1, 16) == block_hashes(turn1, 16)
    assert memo.block_hashes(turn2, 16) == block_hashes(turn2, 16)
    assert (memo.hits, memo.misses) == (10, 15)
    assert memo.block_hashes(turn2, 16) == block_hashes(turn2, 16)
    assert (memo.hits, memo.misses) == (25, 15)


def test_arrays_of_any_integer_type_match_the_reference() -> None:
    rng = random.Random(4)
    ids = _prompt(rng, 100, vocab=2**32)
    memo = BlockHashMemo(segment_blocks=2)
    for dtype in (np.uint32, np.int64, np.uint64):
        assert memo.block_hashes(np.array(ids, dtype=dtype), 8) == block_hashes(ids, 8)
    assert memo.hits == 2 * 12
    wide = [2**40] + ids[1:]
    assert memo.block_hashes(np.array(wide, dtype=np.uint64), 8) == block_hashes(wide, 8)
    assert memo.block_hashes(np.array([-1] + ids[1:]), 8) == block_hashes([-1] + ids[1:], 8)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 60), st.sampled_from(
    [None, "s1"]), st.sampled_from(ALGOS), st.booleans()), min_size=1, max_size=12),
    st.integers(1, 12), st.integers(1, 5))
def test_any_sequence_of_calls_with_segments_matches_the_reference(
        calls: list, capacity: int, segment: int) -> None:
    """Small segments and capacities: segment hits, partial ones and both levels rotating;
    prompts as lists or arrays."""
    rng = random.Random(len(calls) + 7 * segment)
    stems = [_prompt(rng, 32, vocab=8) for _ in range(4)]
    memo = BlockHashMemo(capacity=capacity, segment_blocks=segment)
    for stem, tail, salt, algo, as_array in calls:
        toks = stems[stem] + _prompt(rng, tail, vocab=8)
        arg = np.array(toks, dtype=np.uint32) if as_array else toks
        assert memo.block_hashes(arg, 4, algo=algo, salt=salt) == block_hashes(
            toks, 4, algo=algo, salt=salt)
        assert len(memo) <= 2 * capacity


def test_equal_segments_after_different_prefixes_never_share_hashes() -> None:
    """A segment's hashes depend on everything before it: the same tokens at the same place
    after another prefix (or at another place) are other hashes."""
    rng = random.Random(5)
    a, b, c = (_prompt(rng, 2 * 16, vocab=1000) for _ in range(3))
    memo = BlockHashMemo(segment_blocks=2)
    for toks in (a + c, b + c, c + c, a + c + c, b + c + c):
        assert memo.block_hashes(toks, 16) == block_hashes(toks, 16)
        assert memo.block_hashes(np.array(toks), 16) == block_hashes(toks, 16)
