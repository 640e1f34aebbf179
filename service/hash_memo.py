"""An exact memo of block hashes for Route: repeated prefixes are hashed once, and a prompt
the memo knows whole costs a few lookups, not one per block.

``memo.block_hashes(...)`` takes :func:`kvmesh.hashing.block_hashes`'s arguments and always
returns exactly what it returns: a key holds every input the hashes depend on, field by field.
Two grains (fixed-position segments, single blocks); multimodal requests and ids outside
``[0, 2**32)`` bypass it. Memory is bounded (two generations per grain). Safe to share
between threads: a race can drop an entry, never return a wrong hash.

See docs/architecture.md#routing-in-the-service.
"""
from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

import numpy as np

from kvmesh.hashing import (
    DEFAULT_ALGO,
    Lora,
    MMItem,
    block_hashes,
    extend_block_hashes,
    none_hash,
)

DEFAULT_CAPACITY = 32_768  # blocks per generation: 512K tokens of distinct 16-token blocks
SEGMENT_BLOCKS = 32        # 512 tokens of 16-token blocks: 2 KiB of key
_U32_MAX = (1 << 32) - 1
V = TypeVar("V")


class _Generations(Generic[V]):
    """Two generations of ``key -> value``, each holding values of at most ``capacity``
    blocks in all (a value weighs the blocks it covers)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.young: dict[Hashable, V] = {}
        self.old: dict[Hashable, V] = {}
        self._young_blocks = 0

    def get(self, key: Hashable, blocks: int = 1) -> V | None:
        value = self.young.get(key)
        if value is None:
            value = self.old.get(key)
            if value is not None:
                self.put(key, value, blocks)  # promote: it is in use
        return value

    def put(self, key: Hashable, value: V, blocks: int = 1) -> None:
        if blocks > self.capacity:
            return  # would not fit in any generation
        if self._young_blocks + blocks > self.capacity:
            self.old, self.young, self._young_blocks = self.young, {}, 0
        self.young[key] = value
        self._young_blocks += blocks


def packed_uint32(token_ids: Sequence[int] | np.ndarray, count: int) -> bytes | None:
    """The first ``count`` token ids as little-endian uint32 bytes; None when one of them is
    not an integer in ``[0, 2**32)``."""
    try:
        a = token_ids[:count] if isinstance(token_ids, np.ndarray) else np.asarray(
            token_ids[:count])
    except (OverflowError, TypeError, ValueError):
        return None
    if a.dtype.kind not in "iu" or (len(a) and (a.min() < 0 or a.max() > _U32_MAX)):
        return None
    return a.astype("<u4", copy=False).tobytes()


class BlockHashMemo:
    """Exact, bounded memo of block-hash chains; see the module docstring."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY,
                 segment_blocks: int = SEGMENT_BLOCKS) -> None:
        if capacity < 1 or segment_blocks < 1:
            raise ValueError(f"capacity and segment_blocks must be >= 1, got {capacity} and "
                             f"{segment_blocks}")
        self.capacity = capacity
        self.segment_blocks = segment_blocks
        self._blocks: _Generations[bytes] = _Generations(capacity)
        self._segments: _Generations[tuple[bytes, ...]] = _Generations(capacity)
        self._roots: dict[tuple[str, str | None], bytes] = {}
        self.hits = 0    # blocks answered from the memo
        self.misses = 0  # blocks hashed

    def __len__(self) -> int:
        return len(self._blocks.young) + len(self._blocks.old)

    def block_hashes(self, token_ids: Sequence[int] | np.ndarray, block_size: int, *,
                     algo: str = DEFAULT_ALGO, seed: str | None = None,
                     salt: str | None = None, lora: Lora | None = None,
                     mm: Sequence[MMItem] = ()) -> list[bytes]:
        """Same arguments and result as :func:`kvmesh.hashing.block_hashes`."""
        n = len(token_ids) // block_size if block_size >= 1 else 0
        raw = None if mm or n == 0 else packed_uint32(token_ids, n * block_size)
        if raw is None:  # nothing to hash, or keys the memo does not take
            return block_hashes(token_ids, block_size, algo=algo, seed=seed, salt=salt,
                                lora=lora, mm=mm)
        root = self._roots.get((algo, seed))
        if root is None:
            root = self._roots[algo, seed] = none_hash(algo, seed)
        ctx = (algo, seed, block_size, salt, None if lora is None else tuple(lora))
        width, step = 4 * block_size, self.segment_blocks
        segments, blocks = self._segments, self._blocks
        out: list[bytes] = []
        i = 0
        while i < n:  # whole segments first: a few lookups for a known prompt
            end = min(i + step, n)
            seg = segments.get((ctx, out[-1] if i else root, raw[i * width:end * width]),
                               end - i)
            if seg is None:
                break
            out += seg
            i = end
        first_new_segment = i
        while i < n:  # then block by block, into the segment where the prompt leaves
            h = blocks.get((ctx, out[-1] if i else root, raw[i * width:(i + 1) * width]))
            if h is None:
                break
            out.append(h)
            i += 1
        self.hits += i
        if i < n:
            extend_block_hashes(out, token_ids, block_size, algo=algo, seed=seed, salt=salt,
                                lora=lora)
            self.misses += n - i
            for j in range(i, n):
                blocks.put((ctx, out[j - 1] if j else root, raw[j * width:(j + 1) * width]),
                           out[j])
        for s in range(first_new_segment, n, step):
            end = min(s + step, n)
            segments.put((ctx, out[s - 1] if s else root, raw[s * width:end * width]),
                         tuple(out[s:end]), end - s)
        return out
