"""Mooncake-format traces: loading, and turning hash ids into token ids and block hashes.

Each hash id names one 512-token chunk (prefix-dependent); tokens are synthesised statelessly
(``splitmix64``), so the same id always gives the same tokens. Block hashes are the real
chain, memoized per chunk (valid because ids are prefix-dependent).

See docs/architecture.md#replay-and-simulation.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvmesh.contract import DEFAULT_ALGO
from kvmesh.hashing import Lora, extend_block_hashes, none_hash

CHUNK_TOKENS = 512
DEFAULT_VOCAB = 32_000  # Llama-2's vocabulary (the Mooncake paper's model family)
_M1, _M2, _GOLDEN = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0x9E3779B97F4A7C15


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One trace line. ``arrival_s`` is the timestamp in seconds."""

    index: int
    arrival_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    salt: str | None = None
    lora: Lora | None = None


def _lora(value: object) -> Lora | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return (value, value)
    if isinstance(value, list | tuple) and len(value) == 2:
        return (str(value[0]), str(value[1]))
    raise ValueError(f"lora must be a name or [name, path], got {value!r}")


def parse_line(index: int, line: str) -> TraceRequest:
    """One JSON line -> :class:`TraceRequest`; raises ``ValueError`` naming the problem."""
    try:
        obj = json.loads(line)
        hash_ids = tuple(int(h) for h in obj["hash_ids"])
        req = TraceRequest(index, float(obj["timestamp"]) / 1000.0, int(obj["input_length"]),
                           int(obj["output_length"]), hash_ids, obj.get("salt") or None,
                           _lora(obj.get("lora")))
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"line {index + 1}: not a Mooncake trace record ({e})") from e
    if req.input_length < 1 or req.output_length < 0:
        raise ValueError(f"line {index + 1}: input_length must be >= 1, output_length >= 0")
    if len(hash_ids) * CHUNK_TOKENS < req.input_length:
        raise ValueError(f"line {index + 1}: {len(hash_ids)} hash ids cover fewer than "
                         f"input_length={req.input_length} tokens")
    if any(h < 0 for h in hash_ids):
        raise ValueError(f"line {index + 1}: hash ids must be >= 0")
    return req


def load_trace(path: str | Path, limit: int | None = None) -> list[TraceRequest]:
    """The first ``limit`` requests (all when None) of a JSONL trace, in arrival order
    (a stable sort by timestamp; the shared traces are already sorted)."""
    out: list[TraceRequest] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if limit is not None and len(out) >= limit:
                break
            if line.strip():
                out.append(parse_line(len(out), line))
    out.sort(key=lambda r: r.arrival_s)
    return out


def chunk_tokens(hash_ids: tuple[int, ...] | list[int], num_tokens: int,
                 vocab: int = DEFAULT_VOCAB) -> np.ndarray:
    """The first ``num_tokens`` token ids of the chunks ``hash_ids`` (uint32 array)."""
    ids = np.asarray(hash_ids, dtype=np.uint64)
    x = (ids[:, None] * np.uint64(CHUNK_TOKENS)
         + np.arange(CHUNK_TOKENS, dtype=np.uint64)[None, :]).ravel()[:num_tokens]
    x = x + np.uint64(_GOLDEN)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(_M1)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(_M2)
    x = x ^ (x >> np.uint64(31))
    return (x % np.uint64(vocab)).astype(np.uint32)


class TokenSynth:
    """Prompt tokens and block-hash chains of trace requests, memoized per chunk.

    Contract: ``tokens(req)`` has exactly ``input_length`` ids; ``chain(req)`` equals
    ``block_hashes(tokens(req), block_size, algo=..., seed=..., salt=req.salt, lora=req.lora)``
    (the tests check it) for any trace whose ids are prefix-dependent.
    """

    def __init__(self, block_size: int, *, algo: str = DEFAULT_ALGO, seed: str | None = None,
                 vocab: int = DEFAULT_VOCAB) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size, self.algo, self.seed, self.vocab = block_size, algo, seed, vocab
        self.digest = len(none_hash(algo, seed))
        self._segments: dict[tuple[str | None, Lora | None, int], bytes] = {}
        self.hashed_blocks = 0  # blocks actually hashed (the rest came from the memo)

    def token_array(self, req: TraceRequest) -> np.ndarray:
        return chunk_tokens(req.hash_ids, req.input_length, self.vocab)

    def tokens(self, req: TraceRequest) -> list[int]:
        """The prompt's token ids (a fresh list the caller may extend)."""
        return self.token_array(req).tolist()

    def text(self, req: TraceRequest) -> str:
        """The prompt rendered as text, one character per token (what a text-matching router
        such as Ray's sees): token ``t`` -> ``chr(0x100 + t)``."""
        arr = self.token_array(req) + np.uint32(0x100)
        return arr.astype("<u4").tobytes().decode("utf-32-le")

    def chain(self, req: TraceRequest) -> list[bytes]:
        """Block hashes of the prompt's full blocks (``input_length // block_size``)."""
        bs, d = self.block_size, self.digest
        want = req.input_length // bs
        chain: list[bytes] = []
        for j, h in enumerate(req.hash_ids):
            if len(chain) >= want:
                break
            seg = self._segments.get((req.salt, req.lora, h))
            if seg is None:  # ids are prefix-dependent: every later chunk is new too
                self._hash_from(req, j, chain)
                break
            chain.extend([seg[i:i + d] for i in range(0, len(seg), d)])
        del chain[want:]
        return chain

    def _hash_from(self, req: TraceRequest, j: int, chain: list[bytes]) -> None:
        """Hash the blocks ending in chunks ``j..`` (all of them, full chunks) onto ``chain``
        and memoize each chunk's segment."""
        n = len(req.hash_ids) * CHUNK_TOKENS
        tokens = chunk_tokens(req.hash_ids, n, self.vocab).tolist()
        first = len(chain)
        new = extend_block_hashes(chain, tokens, self.block_size, algo=self.algo,
                                  seed=self.seed, salt=req.salt, lora=req.lora)
        self.hashed_blocks += len(new)
        bs = self.block_size
        for jj in range(j, len(req.hash_ids)):
            # blocks whose last token lies in chunk jj: end in ((jj)*512, (jj+1)*512]
            lo = max(-(-(jj * CHUNK_TOKENS + 1) // bs) - 1, first)
            hi = ((jj + 1) * CHUNK_TOKENS) // bs
            self._segments[(req.salt, req.lora, req.hash_ids[jj])] = b"".join(
                chain[lo:hi])
