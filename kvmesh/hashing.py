"""The block-hash chain: byte-identical to vLLM v1's prefix-caching hashes (vLLM >= 0.31).

A block's hash is ``H((parent_hash, tuple(block_token_ids), extra_keys_or_None))`` over FULL
blocks only; block 0's parent is ``none_hash(algo, seed)``. Every worker and service replica of
a cluster must agree on ``algo`` and ``seed`` (``resolve_seed``, vLLM's rule), or the index
silently finds nothing. Extra keys are vLLM's tagged tuples (LoRA, multimodal, cache salt).
The CBOR encoder and the optional C extension write exactly the bytes ``cbor2`` canonical
would; tests cross-check them.

See docs/architecture.md#the-hash-contract-kvmeshhashingpy.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from operator import itemgetter
from typing import Any

import cbor2
import msgspec
import numpy as np
import xxhash

from kvmesh.contract import (
    ALGOS,
    CBOR_ALGOS,
    DEFAULT_ALGO,
    DIGEST_BYTES,
    SHA256_ALGOS,
    SHA256_CBOR,
)

try:
    from kvmesh._chain import sha256_cbor_chain as _c_chain
    from kvmesh._chain import sha256_cbor_chain_packed as _c_packed
except ImportError:  # not built (no compiler or OpenSSL headers at install): Python only
    _c_chain = _c_packed = None
if os.environ.get("KVMESH_NO_C", "") not in ("", "0"):
    _c_chain = _c_packed = None


def compiled_chain(algo: str) -> bool:
    """Whether ``chain_hashes(..., algo)`` runs in C in this process (a caller that keeps
    chain hashes to avoid recomputing them weighs its bookkeeping against this)."""
    return algo == SHA256_CBOR and _c_chain is not None


DEFAULT_SEED = "vllm-none-hash"

Lora = tuple[str, str]
MMItem = tuple[str, int, int]  # (identifier, offset, length) in prompt token positions
Extra = tuple[tuple[Any, ...], ...] | None


def _check_algo(algo: str) -> None:
    if algo not in ALGOS:
        raise ValueError(f"unknown hash algo {algo!r}; valid: {', '.join(ALGOS)}")


def _sha256_digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _digest(algo: str) -> Callable[[bytes], bytes]:
    return _sha256_digest if algo in SHA256_ALGOS else xxhash.xxh3_128_digest


def _serialize(algo: str, obj: Any) -> bytes:
    if algo in CBOR_ALGOS:
        return cbor2.dumps(obj, canonical=True)
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def hash_value(algo: str, obj: Any) -> bytes:
    """H(obj) with the reference serializer (cbor2 / pickle): the slow, obviously-right path."""
    _check_algo(algo)
    return _digest(algo)(_serialize(algo, obj))


def none_hash(algo: str = DEFAULT_ALGO, seed: str | None = None) -> bytes:
    """The root parent hash: ``H(seed)``; ``seed="0"`` matches vLLM run with PYTHONHASHSEED=0.

    Pure: ``seed=None`` is ``DEFAULT_SEED`` whatever the environment says; processes pick
    their seed once at start with ``resolve_seed``."""
    return hash_value(algo, DEFAULT_SEED if seed is None else seed)


def resolve_seed(algo: str | None, seed: str | None = None,
                 env: Mapping[str, str] | None = None) -> str:
    """The root seed a worker or service process runs with, by vLLM's rule.

    Precedence: an explicit non-empty ``seed`` (``--hash-seed``) wins; else ``PYTHONHASHSEED``
    from ``env`` (default ``os.environ``) when it is set, used verbatim as vLLM does; else
    ``DEFAULT_SEED`` for sha256 and sha256_cbor. For xxhash and xxhash_cbor vLLM would draw a
    random seed per process, so no two processes would agree: that raises ``ValueError``
    (refuse to start). ``algo=None`` (the service, which serves every algorithm) resolves
    like sha256; a worker with an xxhash algorithm carries an explicit seed, which the
    service's root-hash check at registration compares with its own.
    """
    if algo is not None:
        _check_algo(algo)
    if seed:
        return seed
    env_seed = (os.environ if env is None else env).get("PYTHONHASHSEED")
    if env_seed is not None:
        return env_seed
    if algo is not None and algo not in SHA256_ALGOS:
        raise ValueError(
            f"hash algo {algo} needs an explicit seed: pass --hash-seed or set PYTHONHASHSEED "
            "(the same value on every worker, service replica and vLLM instance). Without "
            "one, vLLM seeds xxhash with a random value per process (a predictable seed would "
            "let an attacker precompute colliding blocks), so no two processes would compute "
            "the same block hashes and the index would never match.")
    return DEFAULT_SEED


# --- fast canonical CBOR for the fixed block shape ---------------------------------------

def _head(major: int, n: int) -> bytes:
    """CBOR initial byte(s) with the shortest argument, as canonical encoding requires."""
    m = major << 5
    if n < 24:
        return bytes((m | n,))
    if n < 1 << 8:
        return bytes((m | 24, n))
    if n < 1 << 16:
        return bytes((m | 25,)) + n.to_bytes(2, "big")
    if n < 1 << 32:
        return bytes((m | 26,)) + n.to_bytes(4, "big")
    return bytes((m | 27,)) + n.to_bytes(8, "big")


# Encodings of token ids, indexed by id, for every id below len(_UINT); grown on demand up to
# every id below 2**18 (all current vocabularies, Llama 3 and Qwen included); larger ids use
# the generic encoder. Thread safety: the table is an immutable tuple that is only ever
# replaced whole (one atomic rebinding, under _UINT_GROW so two growers do not race), never
# mutated, so a reader that took a reference sees a complete table and the fast path takes
# no lock. This is the module's only mutable state.
_UINT: tuple[bytes, ...] = ()
_UINT_CAP = 1 << 18
_UINT_GROW = threading.Lock()


def _uint_table(hi: int) -> tuple[bytes, ...]:
    """A table that covers id ``hi`` (``hi < _UINT_CAP``), growing the shared one if needed."""
    global _UINT
    with _UINT_GROW:
        table = _UINT
        if hi >= len(table):
            size = max(1 << 16, 1 << int(hi).bit_length())
            table = table + tuple(_head(0, i) for i in range(len(table), size))
            _UINT = table
    return table


def _cbor_tokens(token_ids: Sequence[int]) -> Sequence[bytes]:
    """Per-token CBOR encodings, computed once for a whole sequence."""
    if not token_ids:
        return ()
    if min(token_ids) < 0:
        return [_cbor_int(int(t)) for t in token_ids]
    # one C call for the whole sequence (itemgetter of n ids returns an n-tuple); an id past
    # the table raises IndexError: grow it, or encode generically past _UINT_CAP
    get = itemgetter(*token_ids) if len(token_ids) > 1 else lambda t: (t[token_ids[0]],)
    table = _UINT  # one read: later growth by another thread cannot change this tuple
    try:
        return get(table)
    except IndexError:
        pass
    hi = max(token_ids)
    if hi >= _UINT_CAP:
        return [_cbor_int(int(t)) for t in token_ids]
    return get(_uint_table(hi))


# Bulk encoding of unsigned ids. Class of an id: 0 (< 24, in the head byte), then 1, 2, 4 or
# 8 argument bytes; per class its head byte, its argument width, and which bytes of a fixed
# record (head + the id big-endian in 4 or 8 bytes) its canonical encoding keeps.
_BOUNDS = np.array([24, 1 << 8, 1 << 16, 1 << 32], dtype=np.uint64)
_HEADS = np.array([0, 0x18, 0x19, 0x1A, 0x1B], dtype=np.uint8)
_WIDTHS = np.array([0, 1, 2, 4, 8], dtype=np.int64)
_RECORD = {4: np.dtype([("head", "u1"), ("arg", ">u4")]),  # packed: 5 or 9 bytes an id
           8: np.dtype([("head", "u1"), ("arg", ">u8")])}
_KEEP = {n: np.array([[True] + [i >= n - w for i in range(n)] for w in (0, 1, 2, 4, 8)
                      if w <= n], dtype=bool) for n in (4, 8)}


def cbor_uint_stream(token_ids: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Canonical CBOR of each of ``token_ids`` (a 1-D array of unsigned ints), back to back,
    and ``starts`` (``len + 1`` offsets): id ``i`` is ``stream[starts[i]:starts[i + 1]]``.
    The same bytes as :func:`_cbor_tokens`, from a few array passes instead of a Python
    step per token: every id is written as a fixed record, then the bytes its class does
    not use are dropped."""
    a = np.asarray(token_ids)
    cls = np.searchsorted(_BOUNDS, a, side="right")
    arg = 8 if len(a) and cls.max() == 4 else 4
    rec = np.empty(len(a), dtype=_RECORD[arg])
    rec["arg"] = a
    rec["head"] = np.where(cls == 0, a, _HEADS[cls])
    starts = np.zeros(len(a) + 1, dtype=np.int64)
    np.cumsum(_WIDTHS[cls] + 1, out=starts[1:])
    return rec.view(np.uint8)[_KEEP[arg][cls].ravel()].tobytes(), starts


def _cbor_int(i: int) -> bytes:
    return _head(0, i) if i >= 0 else _head(1, -1 - i)


_CBOR_NULL = b"\xf6"
_CBOR_ARRAY3 = b"\x83"


def _cbor_extra(extra: Extra) -> bytes:
    # Extra keys are rare and tiny (a few tagged tuples): the reference encoder is fine here.
    return _CBOR_NULL if extra is None else cbor2.dumps(extra, canonical=True)


# --- the chain ----------------------------------------------------------------------------

# a block's CBOR up to its parent's bytes: array(3), then a byte string of the digest's size
_DIGEST_HEAD = {a: _CBOR_ARRAY3 + _head(2, DIGEST_BYTES[a]) for a in CBOR_ALGOS}

def hash_block(parent: bytes, tokens: Sequence[int], extra_keys: Extra, algo: str) -> bytes:
    """One block's hash: ``H((parent, tuple(tokens), extra_keys))``."""
    _check_algo(algo)
    if algo == SHA256_CBOR and _c_chain is not None and len(tokens):
        out = _c_chain(parent, tokens, len(tokens),
                       None if extra_keys is None else [_cbor_extra(extra_keys)])
        if out is not None:
            return out[0]
    if algo in CBOR_ALGOS:
        data = b"".join((_CBOR_ARRAY3, _head(2, len(parent)), parent, _head(4, len(tokens)),
                         *_cbor_tokens(tokens), _cbor_extra(extra_keys)))
        return _digest(algo)(data)
    return hash_value(algo, (parent, tuple(tokens), extra_keys))


def lora_key(name: str, path: str) -> Lora | None:
    """The one definition of a request's LoRA, used by the service and the worker alike.

    An empty name and path (an unset or empty ``Lora`` message) is no LoRA: ``None``, no
    extra key, the same hashes as the base model. A name gives ``(name, path)``, hashed as
    ``("lora", name, path)`` on every block (vLLM's key; its ``LoRARequest`` always has a
    name and a path). A path without a name raises ``ValueError`` (a caller error).
    """
    if not name:
        if path:
            raise ValueError("lora.path is set but lora.name is empty")
        return None
    return (name, path)


def extra_keys(block_start: int, block_end: int, *, salt: str | None = None,
               lora: Lora | None = None, mm: Sequence[MMItem] = ()) -> Extra:
    """The extra keys of the block covering token positions ``[block_start, block_end)``."""
    keys: list[tuple[Any, ...]] = []
    if lora is not None:
        keys.append(("lora", lora[0], lora[1]))
    for ident, offset, length in mm:
        if offset < block_end and offset + length > block_start:
            keys.append(("mm", ident, offset - block_start))
    if salt and block_start == 0:
        keys.append(("cache_salt", salt))
    return tuple(keys) if keys else None


def extend_block_hashes(hashes: list[bytes], token_ids: Sequence[int], block_size: int, *,
                        algo: str = DEFAULT_ALGO, seed: str | None = None,
                        salt: str | None = None, lora: Lora | None = None,
                        mm: Sequence[MMItem] = ()) -> list[bytes]:
    """Incremental hashing: append the hashes of the full blocks of ``token_ids`` that
    ``hashes`` does not cover yet, and return just those.

    ``hashes`` must be the chain of the same sequence so far (same algo/seed/salt/lora/mm);
    a growing sequence therefore hashes each block exactly once.
    """
    _check_algo(algo)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    first = len(hashes)
    last = len(token_ids) // block_size
    if last <= first:
        return []
    parent = hashes[-1] if hashes else none_hash(algo, seed)
    extras = None
    if salt is not None or lora is not None or mm:
        extras = [extra_keys(b * block_size, (b + 1) * block_size, salt=salt, lora=lora, mm=mm)
                  for b in range(first, last)]
    new = chain_hashes(parent, token_ids[first * block_size:last * block_size], block_size,
                       extras, algo)
    hashes.extend(new)
    return new


def chain_hashes(parent: bytes, token_ids: Sequence[int] | msgspec.Raw, block_size: int,
                 extras: Sequence[Extra] | None, algo: str) -> list[bytes]:
    """The hashes of the consecutive full blocks of ``token_ids`` chained below ``parent``
    (``none_hash`` for a chain that starts at block 0): block ``i``'s hash is
    ``hash_block(previous, its tokens, extras[i], algo)``; ``extras=None``: no extra keys on
    any block. Equal to that loop, but each token id is encoded once for the whole run and
    the per-call checks run once. A trailing partial block is not hashed.

    ``token_ids`` may also be a ``msgspec.Raw`` of a msgpack int array (a vLLM event's, as
    ``vllm_events.decode_batch(packed=True)`` leaves it): the C chain reads it as it is; the
    Python path decodes it first."""
    _check_algo(algo)
    in_c = algo == SHA256_CBOR and block_size > 0
    tails = None
    if token_ids.__class__ is msgspec.Raw:
        if in_c and _c_packed is not None:
            tails = None if extras is None else [_cbor_extra(x) for x in extras]
            out = _c_packed(parent, token_ids, block_size, tails)
            if out is not None:
                return out
        token_ids = msgspec.msgpack.decode(token_ids)
        in_c = False  # refused ids (negative, not ints): the list form would refuse them too
    n = len(token_ids) // block_size
    if extras is not None and len(extras) < n:
        raise ValueError(f"{len(extras)} extra keys for {n} blocks")
    if tails is not None:
        tails = tails[:n]
    if in_c and _c_chain is not None:
        if isinstance(token_ids, np.ndarray):
            token_ids = token_ids.tolist()  # faster than the bulk encoder below, even so
        tails = None if extras is None else [_cbor_extra(x) for x in extras[:n]]
        out = _c_chain(parent, token_ids, block_size, tails)
        if out is not None:
            return out
        # refused (an id it does not encode): the Python path, with the tails already made
        tails = tails or [_CBOR_NULL] * n
    new: list[bytes] = []
    bulk = isinstance(token_ids, np.ndarray)
    if bulk and not (token_ids.dtype.kind == "u" and algo in CBOR_ALGOS):
        token_ids = token_ids.tolist()  # pickle and signed ids: exactly Python's ints
        bulk = False
    if algo in CBOR_ALGOS:
        digest = hashlib.sha256 if algo in SHA256_ALGOS else xxhash.xxh3_128
        # every later parent is one of our digests
        next_head = _DIGEST_HEAD[algo]
        head = next_head if len(parent) == DIGEST_BYTES[algo] else (
            _CBOR_ARRAY3 + _head(2, len(parent)))
        tok_head = _head(4, block_size)
        join = b"".join
        if bulk:
            stream, starts = cbor_uint_stream(token_ids[:n * block_size])
            cuts = starts[::block_size].tolist()  # the stream's offset of each block
            bodies = [stream[cuts[i]:cuts[i + 1]] for i in range(n)]
        else:
            enc = _cbor_tokens(token_ids if len(token_ids) == n * block_size
                               else token_ids[:n * block_size])
            bodies = [join(enc[k:k + block_size]) for k in range(0, n * block_size, block_size)]
        if tails is None:
            tails = [_CBOR_NULL] * n if extras is None else [_cbor_extra(x) for x in extras[:n]]
        for body, tail in zip(bodies, tails, strict=True):
            parent = digest(join((head, parent, tok_head, body, tail))).digest()
            new.append(parent)
            head = next_head
    else:  # pickle: already one C call per block; only keep Python overhead out of the loop
        ser = partial(pickle.dumps, protocol=pickle.HIGHEST_PROTOCOL)
        digest = _digest(algo)
        for i in range(n):
            extra = None if extras is None else extras[i]
            parent = digest(ser((parent, tuple(token_ids[i * block_size:(i + 1) * block_size]),
                                 extra)))
            new.append(parent)
    return new


def block_hashes(token_ids: Sequence[int], block_size: int, *, algo: str = DEFAULT_ALGO,
                 seed: str | None = None, salt: str | None = None, lora: Lora | None = None,
                 mm: Sequence[MMItem] = ()) -> list[bytes]:
    """Hashes of the full blocks of ``token_ids``; a trailing partial block is not hashed."""
    hashes: list[bytes] = []
    extend_block_hashes(hashes, token_ids, block_size, algo=algo, seed=seed, salt=salt,
                        lora=lora, mm=mm)
    return hashes
