"""The block-hash contract: byte-identical to vLLM v1's chained block hashes."""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import cbor2
import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from kvmesh import hashing
from kvmesh.hashing import (
    ALGOS,
    block_hashes,
    cbor_uint_stream,
    chain_hashes,
    extend_block_hashes,
    extra_keys,
    hash_block,
    hash_value,
    none_hash,
)


def vllm_style_chain(tokens, block_size, algo, seed="vllm-none-hash", **kw):
    """The chain computed the way vLLM does it: serialize the whole tuple, then digest."""
    ser = ((lambda x: cbor2.dumps(x, canonical=True)) if algo.endswith("_cbor")
           else (lambda x: pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)))
    dig = ((lambda b: hashlib.sha256(b).digest()) if algo.startswith("sha256")
           else xxhash.xxh3_128_digest)
    parent, out = dig(ser(seed)), []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        extra = extra_keys(start, start + block_size, **kw)
        parent = dig(ser((parent, tuple(tokens[start:start + block_size]), extra)))
        out.append(parent)
    return out


def test_cbor_bytes_of_one_block_by_hand():
    # none_hash: CBOR text string of 14 bytes has the initial byte 0x60 | 14 = 0x6e.
    root = hashlib.sha256(b"\x6e" + b"vllm-none-hash").digest()
    assert none_hash("sha256_cbor") == root
    # [parent: bytes(32), [1, 2, 3, 30]: array(4) of uints, null]
    # 0x83 array(3); 0x58 0x20 byte string, 1-byte length 32; 0x84 array(4);
    # 0x01 0x02 0x03 small uints; 0x18 0x1e uint 30 needs a 1-byte argument; 0xf6 null.
    data = b"\x83\x58\x20" + root + b"\x84\x01\x02\x03\x18\x1e\xf6"
    assert data == cbor2.dumps((root, (1, 2, 3, 30), None), canonical=True)
    assert block_hashes([1, 2, 3, 30], 4) == [hashlib.sha256(data).digest()]




@pytest.mark.parametrize("algo", ALGOS)
def test_known_answers_match_vllm_style_reference(algo):
    tokens = list(range(100, 140))
    got = block_hashes(tokens, 16, algo=algo)
    assert got == vllm_style_chain(tokens, 16, algo)
    assert len(got) == 2 and all(len(h) == (32 if algo.startswith("sha256") else 16) for h in got)


# Pinned: tokens 100..139, block size 16, the last of the two full blocks' hashes, plain and
# with salt "acme". A change here breaks every deployed index: bump the namespace, not these.
# The sha256 and sha256_cbor rows are also what vLLM 0.31-0.33 computes (see VLLM_031 below
# for how); the xxhash rows use seed "vllm-none-hash", which vLLM never uses for xxhash (it
# draws a random seed unless PYTHONHASHSEED is set), so they are kvmesh's own.
PINNED = {
    "sha256": ("f1a08810157991d5280c49952540afc2feab260cd65a24bb2e94951059393917",
               "a390e2ef4f7e990b3089220f8d7ec82f07120d41a219f07fa4146fe4a3ba5981"),
    "sha256_cbor": ("ce46e4cdf9f7c965a59bd3429627f27c1400980fc64be5e6706e1a9c55f39878",
                    "8bc980b65e7d914db186aa3facfd4feb33427aa4bfc08420b9c8878dc27a7926"),
    "xxhash": ("67edb92ea117524e7691a2f992b22c57", "ae68689a402a17da05e547cf3a6b2c1d"),
    "xxhash_cbor": ("11df1ceeac9b4d902214867fd6f7aaa7", "c7ea68475cc97785d03e077a26f9ccde"),
}


@pytest.mark.parametrize("algo", ALGOS)
def test_pinned_vectors(algo):
    tokens = list(range(100, 140))
    assert block_hashes(tokens, 16, algo=algo)[-1].hex() == PINNED[algo][0]
    assert block_hashes(tokens, 16, algo=algo, salt="acme")[-1].hex() == PINNED[algo][1]


# Computed by vLLM's own code, not by kvmesh: the pure-Python files of the vllm 0.33.0 wheel
# (`pip download --no-deps vllm==0.33.0`; vllm/v1/core/kv_cache_utils.py, vllm/utils/hashing.py,
# vllm/lora/request.py) imported with stubs for their other vllm imports, then
# `init_none_hash(get_hash_fn_by_name(algo))` and `get_request_block_hasher(16, fn)(request)`
# on a request with `all_token_ids` 100..139 and, one at a time, `cache_salt="acme"`,
# `lora_request=LoRARequest("sql-adapter", 1, "/adapters/sql")` or one `mm_features` item
# (identifier "img-abc", offset 10, length 12); the last block's hash. PYTHONHASHSEED unset for
# the sha256 rows (vLLM's seed "vllm-none-hash"), PYTHONHASHSEED=0 for the xxhash_cbor row.
# The 0.31.0 wheel gives the same values; 0.30.0 hashed untagged extra keys and gives others
# (sha256_cbor salted 2521a1f8..., LoRA 29dd3d09..., mm b721f7f1...).
LORA = ("sql-adapter", "/adapters/sql")
MM = [("img-abc", 10, 12)]
VLLM_031 = {  # (algo, seed): (salted, LoRA, multimodal)
    ("sha256", None): ("a390e2ef4f7e990b3089220f8d7ec82f07120d41a219f07fa4146fe4a3ba5981",
                       "9bf6a539551aa215231ae552cf240658b2cb919e1fe1c0040a6a9448d2044fb2",
                       "072a04263a2b9b61dbd0b851f4fd4c0bc49936da11d556b446fedcee3b6c08d5"),
    ("sha256_cbor", None): ("8bc980b65e7d914db186aa3facfd4feb33427aa4bfc08420b9c8878dc27a7926",
                            "2c6fe6ce98ade7993d8e77d643fde1ec411e3b1d6e3383f14fc296f36255f41c",
                            "3b74be2ed1e7ecab02cbeee670a4db967418116c079bc0bbf9773b63b24e4041"),
    ("xxhash_cbor", "0"): ("94706a810675b95cb8bff6c9878ab090", "cd75f4111b2e5248d19c081f804fec8b",
                           "e4af0d41edd86efb197f90ff6b633b8a"),
}


@pytest.mark.parametrize(("algo", "seed"), list(VLLM_031))
def test_tagged_extra_keys_match_vllm_0_31(algo, seed):
    tokens = list(range(100, 140))
    salted, lora, mm = VLLM_031[algo, seed]
    assert block_hashes(tokens, 16, algo=algo, seed=seed, salt="acme")[-1].hex() == salted
    assert block_hashes(tokens, 16, algo=algo, seed=seed, lora=LORA)[-1].hex() == lora
    assert block_hashes(tokens, 16, algo=algo, seed=seed, mm=MM)[-1].hex() == mm


def test_seed_reproduces_pythonhashseed():
    assert none_hash("sha256", seed="0") == hashlib.sha256(
        pickle.dumps("0", protocol=pickle.HIGHEST_PROTOCOL)).digest()
    assert block_hashes([1] * 16, 16, seed="0") != block_hashes([1] * 16, 16)


def test_unknown_algo_lists_valid_ones():
    with pytest.raises(ValueError, match="sha256_cbor"):
        block_hashes([1, 2], 1, algo="md5")
    with pytest.raises(ValueError, match="xxhash"):
        none_hash("blake3")


def test_partial_blocks_are_never_hashed():
    tokens = list(range(37))
    assert len(block_hashes(tokens, 16)) == 2
    assert block_hashes(tokens[:15], 16) == []
    assert block_hashes(tokens + [5, 6], 16) == block_hashes(tokens, 16)


def test_salt_changes_block_zero_input_only_but_every_hash():
    assert extra_keys(0, 16, salt="tenant-a") == (("cache_salt", "tenant-a"),)
    assert extra_keys(16, 32, salt="tenant-a") is None
    tokens = list(range(64))
    plain, salted = block_hashes(tokens, 16), block_hashes(tokens, 16, salt="tenant-a")
    assert all(a != b for a, b in zip(plain, salted, strict=True))
    assert block_hashes(tokens, 16, salt="") == plain  # an empty salt is no salt, as in vLLM


def test_extra_key_order_and_mm_offsets():
    keys = extra_keys(16, 32, salt="s", lora=("ad", "/p"), mm=[("img", 10, 10), ("aud", 40, 4)])
    # lora first, then every overlapping mm item with offset relative to the block start.
    assert keys == (("lora", "ad", "/p"), ("mm", "img", -6))
    assert extra_keys(0, 16, salt="s", lora=("ad", "/p"))[-1] == ("cache_salt", "s")
    assert extra_keys(0, 16, mm=[("img", 16, 4)]) is None  # touches, does not overlap


token_lists = st.lists(
    st.one_of(st.integers(0, 30), st.integers(0, 70_000), st.integers(0, 2**33)),
    max_size=80)
extras = st.fixed_dictionaries({}, optional={
    "salt": st.text(max_size=8),
    "lora": st.tuples(st.text(max_size=5), st.text(max_size=5)),
    "mm": st.lists(st.tuples(st.text(max_size=3), st.integers(-10, 80), st.integers(1, 20)),
                   max_size=3),
})


@settings(max_examples=150, deadline=None)
@given(tokens=token_lists, block_size=st.integers(1, 9), algo=st.sampled_from(ALGOS), kw=extras)
def test_fast_encoder_equals_reference(tokens, block_size, algo, kw):
    assert block_hashes(tokens, block_size, algo=algo, **kw) == vllm_style_chain(
        tokens, block_size, algo, **kw)


@settings(max_examples=100, deadline=None)
@given(tokens=token_lists, block_size=st.integers(1, 9), algo=st.sampled_from(ALGOS),
       cuts=st.lists(st.integers(0, 80), max_size=4), kw=extras)
def test_incremental_equals_one_shot(tokens, block_size, algo, cuts, kw):
    chain: list[bytes] = []
    for cut in sorted(cuts) + [len(tokens)]:
        new = extend_block_hashes(chain, tokens[:cut], block_size, algo=algo, **kw)
        assert chain[len(chain) - len(new):] == new
    assert chain == block_hashes(tokens, block_size, algo=algo, **kw)


@given(parent=st.binary(min_size=32, max_size=32), tokens=token_lists)
def test_hash_block_equals_reference(parent, tokens):
    for algo in ALGOS:
        assert hash_block(parent, tokens, None, algo) == hash_value(
            algo, (parent, tuple(tokens), None))


@settings(max_examples=100, deadline=None)
@given(parent=st.binary(min_size=16, max_size=32), tokens=token_lists,
       block_size=st.integers(1, 9), algo=st.sampled_from(ALGOS),
       keyed=st.lists(st.sampled_from([None, (("cache_salt", "s"),), (("mm", "img", -3),),
                                       (("lora", "a", "/p"), ("mm", "x", 0))]), max_size=12))
def test_chain_hashes_equals_hash_block_loop(parent, tokens, block_size, algo, keyed):
    n = len(tokens) // block_size
    extras = (keyed * (n + 1))[:n] if keyed else None
    want, prev = [], parent
    for i in range(n):
        prev = hash_block(prev, tokens[i * block_size:(i + 1) * block_size],
                          extras[i] if extras else None, algo)
        want.append(prev)
    assert chain_hashes(parent, tokens, block_size, extras, algo) == want


# Every class boundary of CBOR's unsigned ints: in the head, 1, 2, 4 and 8 argument bytes.
UINT_EDGES = [0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1]
uint_lists = st.lists(st.one_of(st.sampled_from(UINT_EDGES), st.integers(0, 2**64 - 1),
                                st.integers(0, 300)), max_size=80)


@settings(max_examples=150, deadline=None)
@given(ids=uint_lists)
def test_bulk_cbor_stream_is_cbor2_canonical(ids):
    narrow = all(i < 2**32 for i in ids)
    for dtype in (np.uint64, np.uint32) if narrow else (np.uint64,):
        stream, starts = cbor_uint_stream(np.array(ids, dtype=dtype))
        assert len(starts) == len(ids) + 1 and starts[0] == 0 and starts[-1] == len(stream)
        assert [stream[starts[i]:starts[i + 1]] for i in range(len(ids))] == [
            cbor2.dumps(i, canonical=True) for i in ids]


@settings(max_examples=100, deadline=None)
@given(ids=uint_lists, block_size=st.integers(1, 9), algo=st.sampled_from(ALGOS), kw=extras,
       cut=st.integers(0, 80))
def test_numpy_arrays_hash_like_lists(ids, block_size, algo, kw, cut):
    """Arrays of unsigned ids take the bulk encoder (CBOR), others their ints; any array
    hashes exactly as the list of its ids, one shot or incrementally."""
    want = vllm_style_chain(ids, block_size, algo, **kw)
    arr = np.array(ids, dtype=np.uint32 if all(i < 2**32 for i in ids) else np.uint64)
    assert block_hashes(arr, block_size, algo=algo, **kw) == want
    chain: list[bytes] = []
    extend_block_hashes(chain, arr[:cut], block_size, algo=algo, **kw)
    extend_block_hashes(chain, arr, block_size, algo=algo, **kw)
    assert chain == want
    signed = [i - 2**31 for i in ids if i < 2**32]
    assert block_hashes(np.array(signed, dtype=np.int64), block_size, algo=algo,
                        **kw) == vllm_style_chain(signed, block_size, algo, **kw)


# --- The token encoder's edges: negative ids, ids past the table (it grows) or past its cap, one
# token, none; every path against cbor2's canonical encoding.

ids = st.lists(st.one_of(st.integers(-2**63, -1), st.integers(0, 30), st.integers(0, 2**18 + 9),
                         st.integers(0, 2**64 - 1)), max_size=24)


def check(tokens: list[int], block_size: int) -> None:
    parent = b"p" * 32
    assert hash_block(parent, tokens, None, "sha256_cbor") == hash_value(
        "sha256_cbor", (parent, tuple(tokens), None))
    want, prev = [], parent
    for i in range(len(tokens) // block_size):
        block = tuple(tokens[i * block_size:(i + 1) * block_size])
        prev = hash_value("sha256_cbor", (prev, block, None))
        want.append(prev)
    assert chain_hashes(parent, tokens, block_size, None, "sha256_cbor") == want


@settings(max_examples=200, deadline=None)
@given(tokens=ids, fresh=st.booleans(), block_size=st.integers(1, 5))
def test_token_paths_match_cbor2(tokens, fresh, block_size) -> None:
    table = hashing._UINT
    if fresh:
        hashing._UINT = ()  # an empty table: the first id past it grows it
    try:
        check(tokens, block_size)
    finally:
        hashing._UINT = table


def test_one_token_and_none() -> None:
    for tokens in ([], [0], [23], [24], [2**18], [-1], [2**64 - 1]):
        check(tokens, 1)


# --- Every public hashing function is safe under concurrent use.
# The fast CBOR path keeps a process-wide table of token encodings that is built on first use.
# A race while it is built poisons it for the life of the process, so each round runs against
# a fresh module state: the hammer runs in a subprocess that reloads ``kvmesh.hashing`` before
# every round, starts 8 threads at one barrier and compares every hash with cbor2 + hashlib.

ROOT = Path(__file__).resolve().parents[2]

HAMMER = textwrap.dedent("""
    import hashlib, importlib, json, random, sys, threading
    import cbor2, xxhash
    import kvmesh.hashing as h

    sys.setswitchinterval(1e-6)  # switch threads as often as CPython allows

    def reference(tokens, block_size, algo, salt=None):
        dig = ((lambda b: hashlib.sha256(b).digest()) if algo == "sha256_cbor"
               else xxhash.xxh3_128_digest)
        parent, out = dig(cbor2.dumps("vllm-none-hash", canonical=True)), []
        for start in range(0, len(tokens) - block_size + 1, block_size):
            extra = (("cache_salt", salt),) if salt and start == 0 else None
            data = cbor2.dumps((parent, tuple(tokens[start:start + block_size]), extra),
                               canonical=True)
            parent = dig(data)
            out.append(parent)
        return out

    def work(rng):
        # Ids up to 2**17, some small (the first growth) and some large (the second).
        top = rng.choice((1 << 10, 1 << 16, 1 << 17))
        tokens = [rng.randrange(top) for _ in range(rng.randrange(16, 400))]
        bs = rng.choice((1, 4, 16))
        algo = rng.choice(("sha256_cbor", "xxhash_cbor"))
        salt = rng.choice((None, "s"))
        kind = rng.randrange(3)
        if kind == 0:
            got = h.block_hashes(tokens, bs, algo=algo, salt=salt)
        elif kind == 1:
            got = []
            h.extend_block_hashes(got, tokens[:len(tokens) // 2], bs, algo=algo, salt=salt)
            h.extend_block_hashes(got, tokens, bs, algo=algo, salt=salt)
        else:
            salt, got, parent = None, [], h.none_hash(algo)
            for start in range(0, len(tokens) - bs + 1, bs):
                parent = h.hash_block(parent, tokens[start:start + bs], None, algo)
                got.append(parent)
        return got == reference(tokens, bs, algo, salt)

    rounds, threads, calls = (int(a) for a in sys.argv[1:4])
    bad_rounds = 0
    for r in range(rounds):
        importlib.reload(h)  # a fresh, empty encoding table each round
        gate = threading.Barrier(threads)
        wrong = []

        def run(seed):
            rng = random.Random(seed)
            gate.wait()
            for _ in range(calls):
                if not work(rng):
                    wrong.append(seed)

        ts = [threading.Thread(target=run, args=(r * 100 + i,)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        # Afterwards, single-threaded: ordinary ids must still hash right.
        after = all(work(random.Random(10_000 + i)) for i in range(20))
        bad_rounds += bool(wrong) or not after
    print(json.dumps({"rounds": rounds, "bad_rounds": bad_rounds}))
""")


@pytest.mark.slow
def test_eight_threads_hash_like_the_reference():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", HAMMER, "10", "8", "6"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"rounds": 10, "bad_rounds": 0}
