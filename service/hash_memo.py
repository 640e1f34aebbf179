"""An exact memo of block hashes for Route: repeated prefixes are hashed once.

Routing hashes every prompt's whole chain, and prompts mostly share long prefixes (system
prompts, RAG templates, earlier turns), so the service keeps computing the same blocks.
:class:`BlockHashMemo` remembers ``hash input -> hash`` for each block it computed and walks
the chain through that map before hashing what is left.

Contract:

- ``memo.block_hashes(...)`` takes the arguments of :func:`kvmesh.hashing.block_hashes` and
  always returns exactly what it returns. The memo key IS the block's hash input (parent hash,
  the block's token ids packed as little-endian int64, and block 0's salt), kept per
  algorithm, so no two different inputs can share an entry: there is no collision risk beyond
  the hash function's own.
- Requests with a LoRA adapter or multimodal items (their extra keys vary per block) and token
  ids outside int64 bypass the memo and are hashed directly.
- Memory is bounded: two generations of at most ``capacity`` entries each (a hit in the old
  generation moves the entry to the young one; a full young generation becomes the old one,
  dropping the previous old one), so at most ``2 * capacity`` blocks are held, the recently
  used ones. An entry costs about 300 bytes with 16-token blocks.
- Safe to share between the event loop and worker threads: every stored entry is an exact
  input/output pair, so a race can at worst drop an entry, never return a wrong hash.
"""
from __future__ import annotations

import struct
from collections.abc import Sequence

from kvmesh.hashing import (
    DEFAULT_ALGO,
    Lora,
    MMItem,
    block_hashes,
    extend_block_hashes,
    none_hash,
)

DEFAULT_CAPACITY = 32_768  # blocks per generation: 512K tokens of distinct 16-token blocks


class BlockHashMemo:
    """Exact, bounded memo of block-hash chains; see the module docstring."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._young: dict[str, dict[bytes, bytes]] = {}  # algo -> key -> hash
        self._old: dict[str, dict[bytes, bytes]] = {}
        self._roots: dict[tuple[str, str | None], bytes] = {}
        self.hits = 0    # blocks answered from the memo
        self.misses = 0  # blocks hashed

    def __len__(self) -> int:
        return sum(map(len, self._young.values())) + sum(map(len, self._old.values()))

    def _store(self, algo: str, key: bytes, value: bytes) -> None:
        young = self._young.setdefault(algo, {})
        if len(young) >= self.capacity:
            self._old[algo] = young
            young = self._young[algo] = {}
        young[key] = value

    def block_hashes(self, token_ids: Sequence[int], block_size: int, *,
                     algo: str = DEFAULT_ALGO, seed: str | None = None,
                     salt: str | None = None, lora: Lora | None = None,
                     mm: Sequence[MMItem] = ()) -> list[bytes]:
        """Same arguments and result as :func:`kvmesh.hashing.block_hashes`."""
        n = len(token_ids) // block_size if block_size >= 1 else 0
        if lora is not None or mm or n == 0:
            return block_hashes(token_ids, block_size, algo=algo, seed=seed, salt=salt,
                                lora=lora, mm=mm)
        try:
            raw = struct.pack(f"<{n * block_size}q", *token_ids[:n * block_size])
        except struct.error:  # not an int64: let the reference path decide what it means
            return block_hashes(token_ids, block_size, algo=algo, seed=seed, salt=salt)
        root = self._roots.get((algo, seed))
        if root is None:
            root = self._roots[algo, seed] = none_hash(algo, seed)
        width = 8 * block_size
        first_key = root + raw[:width] + (salt.encode() if salt else b"")
        young = self._young.get(algo, {})
        old = self._old.get(algo, {})
        out: list[bytes] = []
        key = first_key
        for i in range(n):
            if i:
                key = out[-1] + raw[i * width:(i + 1) * width]
            h = young.get(key)
            if h is None:
                h = old.get(key)
                if h is None:
                    break
                self._store(algo, key, h)  # promote: it is in use
            out.append(h)
        done = len(out)
        self.hits += done
        if done < n:
            extend_block_hashes(out, token_ids, block_size, algo=algo, seed=seed, salt=salt)
            self.misses += n - done
            for i in range(done, n):
                key = first_key if i == 0 else out[i - 1] + raw[i * width:(i + 1) * width]
                self._store(algo, key, out[i])
        return out
