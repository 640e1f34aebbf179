"""The C sha256_cbor chain (kvmesh/_chain.c) against the Python path and the reference
(cbor2 canonical + hashlib): byte-identical on every CBOR width, parent length, block size,
partial block and extra keys; what it refuses falls back to the Python path."""
from __future__ import annotations

import array
import hashlib
import os
import shutil
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import cbor2
import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvmesh import hashing
from kvmesh.hashing import block_hashes, chain_hashes, hash_block, none_hash

ROOT = Path(__file__).resolve().parents[2]
BUILDABLE = bool(shutil.which("cc")) and Path("/usr/include/openssl/sha.h").exists()
try:
    from kvmesh._chain import sha256_cbor_chain
except ImportError:
    sha256_cbor_chain = None
needs_c = pytest.mark.skipif(sha256_cbor_chain is None, reason="kvmesh._chain is not built")


def test_extension_is_built_where_it_can_be():
    """A failed build is only a warning (optional=True): catch it where it should work."""
    if not BUILDABLE:
        pytest.skip("no C compiler or OpenSSL headers: the Python path is the only one")
    # not built? `pip install -e .` or, in place, `python setup.py build_ext --inplace`
    import kvmesh._chain  # noqa: F401
    assert hashing._c_chain is not None or os.environ.get("KVMESH_NO_C")

EDGES = [0, 1, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1]
ids = st.one_of(st.sampled_from(EDGES), st.integers(0, 300), st.integers(0, 2**64 - 1))
parents = st.one_of(st.just(none_hash()), st.binary(min_size=32, max_size=32),
                    st.binary(max_size=300))
extras = st.sampled_from([None, (("cache_salt", "s"),), (("lora", "a", "/p/a"),),
                          (("mm", "f" * 64, -3), ("mm", "e" * 64, 5)), ()])


def reference(parent: bytes, tokens, block_size: int, keys) -> list[bytes]:
    out = []
    for i in range(len(tokens) // block_size):
        block = tuple(tokens[i * block_size:(i + 1) * block_size])
        extra = None if keys is None else keys[i]
        parent = hashlib.sha256(cbor2.dumps((parent, block, extra), canonical=True)).digest()
        out.append(parent)
    return out


@contextmanager
def python_only():
    saved = hashing._c_chain, hashing._c_packed
    hashing._c_chain = hashing._c_packed = None
    try:
        yield
    finally:
        hashing._c_chain, hashing._c_packed = saved


def python_chain(*args):
    with python_only():
        return chain_hashes(*args)


@needs_c
@settings(max_examples=300, deadline=None)
@given(parent=parents, tokens=st.lists(ids, max_size=100), block_size=st.integers(1, 32),
       keyed=st.booleans(), data=st.data(), as_tuple=st.booleans())
def test_c_equals_python_and_reference(parent, tokens, block_size, keyed, data, as_tuple):
    n = len(tokens) // block_size
    keys = data.draw(st.lists(extras, min_size=n, max_size=n + 2)) if keyed else None
    tails = None if keys is None else [hashing._cbor_extra(k) for k in keys]
    seq = tuple(tokens) if as_tuple else tokens
    want = reference(parent, tokens, block_size, keys)
    assert sha256_cbor_chain(parent, seq, block_size, tails) == want
    assert chain_hashes(parent, seq, block_size, keys, "sha256_cbor") == want
    assert python_chain(parent, seq, block_size, keys, "sha256_cbor") == want


@needs_c
@settings(max_examples=100, deadline=None)
@given(parent=parents, tokens=st.lists(ids, min_size=1, max_size=40), extra=extras)
def test_hash_block_c_equals_reference(parent, tokens, extra):
    want = reference(parent, tokens, len(tokens), [extra])[0]
    assert hash_block(parent, tokens, extra, "sha256_cbor") == want
    with python_only():
        assert hash_block(parent, tokens, extra, "sha256_cbor") == want


@needs_c
@pytest.mark.parametrize("bad", [-1, -2**63, 2**64, 2**70, 1.0, np.int64(5), "7", None])
def test_refused_ids_fall_back(bad):
    """Whatever the Python path does with them, the same: negative ids and numpy ints hash as
    the reference does; ids >= 2**64 (OverflowError: no CBOR bignums) and non-ints raise."""
    parent, tokens = none_hash(), [3, 24, bad, 70000]
    assert sha256_cbor_chain(parent, tokens, 2, None) is None
    assert sha256_cbor_chain(parent, tokens, 2, [b"\xf6"] * 2) is None
    if isinstance(bad, np.integer) or (isinstance(bad, int) and bad < 0):
        want = reference(parent, [int(t) for t in tokens], 2, None)
        assert chain_hashes(parent, tokens, 2, None, "sha256_cbor") == want
        assert hash_block(parent, tokens, None, "sha256_cbor") == reference(
            parent, [int(t) for t in tokens], 4, None)[0]
        return
    with pytest.raises(Exception) as python:
        python_chain(parent, tokens, 2, None, "sha256_cbor")
    with pytest.raises(python.type):
        chain_hashes(parent, tokens, 2, None, "sha256_cbor")


@needs_c
def test_a_refused_id_past_the_first_block_still_falls_back_whole():
    tokens = [1, 2, 3, -4]
    assert sha256_cbor_chain(none_hash(), tokens, 2, None) is None
    # only full blocks are read: an id in the trailing partial block is never looked at
    assert sha256_cbor_chain(none_hash(), tokens, 3, None) == reference(
        none_hash(), tokens, 3, None)
    assert chain_hashes(none_hash(), tokens, 2, None, "sha256_cbor") == reference(
        none_hash(), tokens, 2, None)


@needs_c
def test_other_sequences_and_parents_fall_back():
    tokens = [5, 300, 70000, 2**40]
    want = reference(none_hash(), tokens, 2, None)
    for seq in (range(0), array.array("Q", tokens), np.array(tokens, dtype=np.uint64)):
        assert sha256_cbor_chain(none_hash(), seq, 2, None) is None
    assert sha256_cbor_chain(bytearray(none_hash()), tokens, 2, None) is None
    for seq in (array.array("Q", tokens), np.array(tokens, dtype=np.uint64),
                np.array(tokens, dtype=np.int64)):
        assert chain_hashes(none_hash(), seq, 2, None, "sha256_cbor") == want
    assert chain_hashes(bytearray(none_hash()), tokens, 2, None, "sha256_cbor") == want
    # bools are ints to the Python path's table too (1, not CBOR true): same bytes both ways
    assert chain_hashes(none_hash(), [True, 0], 2, None, "sha256_cbor") == python_chain(
        none_hash(), [True, 0], 2, None, "sha256_cbor")


@needs_c
def test_caller_errors_raise():
    with pytest.raises(ValueError):
        sha256_cbor_chain(b"", [1], 0, None)
    with pytest.raises(ValueError):
        sha256_cbor_chain(b"", [1, 2], 1, [b"\xf6"])
    with pytest.raises(TypeError):
        sha256_cbor_chain(b"", [1], 1, ["\xf6"])
    with pytest.raises(TypeError):
        sha256_cbor_chain(b"", [1], 1)
    assert sha256_cbor_chain(b"", [], 1, None) == []


@needs_c
@settings(max_examples=100, deadline=None)
@given(tokens=st.lists(st.integers(0, 2**17), max_size=80), block_size=st.integers(1, 16),
       salt=st.sampled_from([None, "s"]), lora=st.sampled_from([None, ("a", "/p")]),
       mm=st.sampled_from([(), (("img", 3, 20),)]))
def test_block_hashes_with_and_without_c(tokens, block_size, salt, lora, mm):
    kw = {"salt": salt, "lora": lora, "mm": mm, "seed": "0"}
    got = block_hashes(tokens, block_size, **kw)
    with python_only():
        assert block_hashes(tokens, block_size, **kw) == got
    assert block_hashes(np.array(tokens, dtype=np.uint32), block_size, **kw) == got


@needs_c
def test_env_switch_turns_c_off():
    code = "import kvmesh.hashing as h; print(h._c_chain is None)"
    for value, off in (("1", "True"), ("0", "False"), ("", "False")):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "KVMESH_NO_C": value}
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, timeout=60,
                             capture_output=True, text=True, check=True)
        assert out.stdout.strip() == off


# --- token ids as msgpack (the vLLM bridge's events, msgspec.Raw) --------------------------

try:
    from kvmesh._chain import msgpack_len, sha256_cbor_chain_packed
except ImportError:
    msgpack_len = sha256_cbor_chain_packed = None

_UINT, _INT = {1: 0xcc, 2: 0xcd, 4: 0xce, 8: 0xcf}, {1: 0xd0, 2: 0xd1, 4: 0xd2, 8: 0xd3}


def mp_int(v: int, w: int, signed: bool = False) -> bytes:
    """``v`` as msgpack, written by hand so that every width is reachable (msgspec writes
    the shortest): ``w=0`` a fixint, else ``w`` bytes, uint 8-64 or (``signed``) int 8-64."""
    if w == 0:
        return (v & 0xff).to_bytes(1, "big")
    tag = _INT[w] if signed or v < 0 else _UINT[w]
    return bytes([tag]) + v.to_bytes(w, "big", signed=signed or v < 0)


def mp_head(n: int, form: str) -> bytes:
    return {"fix": bytes([0x90 | n]) if n < 16 else b"", "16": b"\xdc" + n.to_bytes(2, "big"),
            "32": b"\xdd" + n.to_bytes(4, "big")}[form]


@st.composite
def packed(draw, values=ids, max_size=100) -> tuple[list[int], bytes]:
    """(ids, the msgpack of their array), each id and the head in a width drawn among those
    that hold it."""
    out = draw(st.lists(values, max_size=max_size))
    forms = ["16", "32"] + (["fix"] if len(out) < 16 else [])
    body = [mp_head(len(out), draw(st.sampled_from(forms)))]
    for v in out:
        widths = [w for w in (1, 2, 4, 8) if (-(2**(8 * w - 1)) <= v < 2**(8 * w - 1)
                                              if v < 0 else v < 2**(8 * w))]
        if -32 <= v < 128:
            widths.append(0)
        body.append(mp_int(v, draw(st.sampled_from(widths))))
    return out, b"".join(body)


needs_packed = pytest.mark.skipif(sha256_cbor_chain_packed is None,
                                  reason="kvmesh._chain is not built")


@needs_packed
@settings(max_examples=300, deadline=None)
@given(parent=parents, tp=packed(), block_size=st.integers(1, 32), keyed=st.booleans(),
       data=st.data())
def test_packed_ids_hash_as_the_reference(parent, tp, block_size, keyed, data):
    tokens, buf = tp
    assert msgspec.msgpack.decode(buf) == tokens  # the test's encoder is msgpack
    n = len(tokens) // block_size
    keys = data.draw(st.lists(extras, min_size=n, max_size=n + 2)) if keyed else None
    tails = None if keys is None else [hashing._cbor_extra(k) for k in keys]
    want = reference(parent, tokens, block_size, keys)
    assert sha256_cbor_chain_packed(parent, msgspec.Raw(buf), block_size, tails) == want
    assert sha256_cbor_chain_packed(parent, buf, block_size, tails) == want
    assert chain_hashes(parent, msgspec.Raw(buf), block_size, keys, "sha256_cbor") == want
    assert python_chain(parent, msgspec.Raw(buf), block_size, keys, "sha256_cbor") == want
    assert msgpack_len(buf) == msgpack_len(msgspec.Raw(buf), False) == len(tokens)


@needs_packed
@settings(max_examples=200, deadline=None)
@given(tp=packed(st.one_of(ids, st.integers(-2**63, -1)), max_size=40),
       block_size=st.integers(1, 8))
def test_signed_ids_count_and_fall_back(tp, block_size):
    """msgpack_len counts what msgspec decodes as list[int]; the chain takes only uints and
    leaves the rest to the Python path, which hashes them as the reference does."""
    tokens, buf = tp
    assert msgpack_len(buf) == len(tokens)
    got = sha256_cbor_chain_packed(none_hash(), buf, block_size, None)
    if any(t < 0 for t in tokens):
        assert got is None
    want = reference(none_hash(), tokens, block_size, None)
    assert chain_hashes(none_hash(), msgspec.Raw(buf), block_size, None, "sha256_cbor") == want


NOT_INTS = [b"\xc0", b"\xc2", b"\xc3", b"\xca\x3f\x80\x00\x00", b"\xcb" + bytes(8), b"\xa1A",
            b"\xc4\x01\x00", b"\x90", b"\x80"]  # nil, bools, floats, str, bin, array, map
NEGATIVE = [mp_int(-1, 0), mp_int(-32, 0)] + [mp_int(v, w) for v, w in (
    (-1, 1), (-129, 2), (-2**31, 4), (-2**63, 8))]
POSITIVE_SIGNED = [mp_int(5, w, signed=True) for w in (1, 2, 4, 8)]  # int 8-64, value >= 0


@needs_packed
@pytest.mark.parametrize("bad", NOT_INTS + NEGATIVE + POSITIVE_SIGNED)
@pytest.mark.parametrize("where", [0, 2, 4])  # first block, second block, partial block
def test_packed_refusals_fall_back(bad, where):
    """Anything but uints, in a full block or the partial one: None from C; the Python path
    on the decoded array decides (hashes for ints, its error for the rest)."""
    items = [mp_int(3, 0), mp_int(300, 2), mp_int(70000, 4), mp_int(2**40, 8), mp_int(7, 1)]
    items.insert(where, bad)
    buf = mp_head(len(items), "fix") + b"".join(items)
    decoded = msgspec.msgpack.decode(buf)
    assert sha256_cbor_chain_packed(none_hash(), buf, 2, None) is None
    assert sha256_cbor_chain_packed(none_hash(), buf, 2, [b"\xf6"] * 3) is None
    is_int = bad in NEGATIVE or bad in POSITIVE_SIGNED
    assert msgpack_len(buf) == (len(items) if is_int else None)
    got = outcome(chain_hashes, none_hash(), msgspec.Raw(buf), 2, None, "sha256_cbor")
    assert got == outcome(python_chain, none_hash(), decoded, 2, None, "sha256_cbor")
    if is_int:
        assert got == reference(none_hash(), decoded, 2, None)


def outcome(f, *args):
    """What ``f(*args)`` returns, or the type of what it raises."""
    try:
        return f(*args)
    except Exception as e:  # noqa: BLE001 - the type is the outcome
        return type(e)


GOOD = mp_head(4, "16") + mp_int(1, 0) + mp_int(200, 1) + mp_int(60000, 2) + mp_int(2**33, 8)
MALFORMED = [
    b"", GOOD[:1], GOOD[:2],              # no head, a cut array16 head
    GOOD[:-1], GOOD[:-9], GOOD[:-10],     # the last int cut, gone, and one byte more gone
    GOOD + b"\x00",                       # a byte after the array
    b"\xdc\x00\x05" + GOOD[3:],           # one int fewer than the head says
    b"\xdd\xff\xff\xff\xff" + GOOD[3:],   # a head far past the buffer: refused unsized
    b"\x80", b"\x05", b"\xc0",            # a map, an int, nil
]


@needs_packed
@pytest.mark.parametrize("buf", MALFORMED)
def test_malformed_buffers_are_refused(buf):
    assert msgpack_len(buf) is None
    assert sha256_cbor_chain_packed(none_hash(), buf, 1, None) is None
    assert sha256_cbor_chain_packed(none_hash(), buf, 2, None) is None


@needs_packed
def test_packed_caller_errors_raise():
    assert msgpack_len(GOOD) == 4 and msgpack_len(GOOD, False) == 4
    assert msgpack_len(GOOD + b"\x00", False) == 4  # the head only, as documented
    with pytest.raises(ValueError):
        sha256_cbor_chain_packed(b"", GOOD, 0, None)
    with pytest.raises(ValueError):
        sha256_cbor_chain_packed(b"", GOOD, 1, [b"\xf6"] * 3)
    with pytest.raises(TypeError):
        sha256_cbor_chain_packed(b"", [1, 2], 1, None)  # not bytes-like
    with pytest.raises(TypeError):
        msgpack_len([1])
    assert sha256_cbor_chain_packed(bytearray(b""), GOOD, 1, None) is None
    assert sha256_cbor_chain_packed(b"", b"\x90", 1, None) == []


@needs_c
def test_threads_hashing_at_once_each_get_their_own_chain() -> None:
    """No state is shared between calls (the module's contract): 8 threads hashing different
    chains at once, list and packed forms interleaved, each get exactly the reference."""
    rng = np.random.default_rng(7)
    jobs = [rng.integers(0, 1 << 20, 16 * 64).tolist() for _ in range(8)]
    want = [reference(none_hash(), ids, 16, [None] * 64) for ids in jobs]
    got: list[list] = [[] for _ in jobs]

    def work(i: int) -> None:
        raw = msgspec.Raw(msgspec.msgpack.encode(jobs[i]))
        for k in range(50):
            got[i].append(chain_hashes(none_hash(), raw if k % 2 else jobs[i], 16, None,
                                       "sha256_cbor"))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, runs in enumerate(got):
        assert len(runs) == 50 and all(r == want[i] for r in runs)
