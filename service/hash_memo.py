"""An exact memo of block hashes for Route: repeated prefixes are hashed once.

Routing hashes every prompt's whole chain, and prompts mostly share long prefixes (system
prompts, RAG templates, earlier turns), so the service keeps computing the same blocks.
:class:`BlockHashMemo` remembers ``hash input -> hash`` for each block it computed and walks
the chain through that map before hashing what is left.

Contract:

- ``memo.block_hashes(...)`` takes the arguments of :func:`kvmesh.hashing.block_hashes` and
  always returns exactly what it returns. An entry's key is the tuple ``(context, parent,
  tokens)``: ``context = (algo, seed, block_size, salt, lora)``, every argument the chain
  depends on besides the tokens; ``parent`` the parent hash (the root, ``none_hash(algo,
  seed)``, for block 0); ``tokens`` the block's token ids packed as little-endian int64. Tuple
  fields are compared one by one, so no field can spill into another (the salt cannot pass
  for tokens, a block of 8 for half a block of 16): two keys are equal only when every input
  of :func:`block_hashes` that decides the hash is equal, and there is no collision risk
  beyond the hash function's own. The salt sits in every block's context although it only
  enters block 0's hash: later blocks chain on block 0 anyway, so this costs no sharing.
- Requests with multimodal items (their extra keys vary per block) and token ids outside
  int64 bypass the memo and are hashed directly.
- Memory is bounded: two generations of at most ``capacity`` entries each (a hit in the old
  generation moves the entry to the young one; a full young generation becomes the old one,
  dropping the previous old one), so at most ``2 * capacity`` blocks are held, the recently
  used ones. An entry costs about 350 bytes with 16-token blocks.
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

# (algo, seed, block size, salt, lora), parent hash, the block's tokens as packed int64
_Key = tuple[tuple[str, str | None, int, str | None, tuple[str, ...] | None], bytes, bytes]
DEFAULT_CAPACITY = 32_768  # blocks per generation: 512K tokens of distinct 16-token blocks


class BlockHashMemo:
    """Exact, bounded memo of block-hash chains; see the module docstring."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._young: dict[_Key, bytes] = {}  # key -> hash
        self._old: dict[_Key, bytes] = {}
        self._roots: dict[tuple[str, str | None], bytes] = {}
        self.hits = 0    # blocks answered from the memo
        self.misses = 0  # blocks hashed

    def __len__(self) -> int:
        return len(self._young) + len(self._old)

    def _store(self, key: _Key, value: bytes) -> None:
        if len(self._young) >= self.capacity:
            self._old, self._young = self._young, {}
        self._young[key] = value

    def block_hashes(self, token_ids: Sequence[int], block_size: int, *,
                     algo: str = DEFAULT_ALGO, seed: str | None = None,
                     salt: str | None = None, lora: Lora | None = None,
                     mm: Sequence[MMItem] = ()) -> list[bytes]:
        """Same arguments and result as :func:`kvmesh.hashing.block_hashes`."""
        n = len(token_ids) // block_size if block_size >= 1 else 0
        if mm or n == 0:
            return block_hashes(token_ids, block_size, algo=algo, seed=seed, salt=salt,
                                lora=lora, mm=mm)
        try:
            raw = struct.pack(f"<{n * block_size}q", *token_ids[:n * block_size])
        except struct.error:  # not an int64: let the reference path decide what it means
            return block_hashes(token_ids, block_size, algo=algo, seed=seed, salt=salt,
                                lora=lora)
        root = self._roots.get((algo, seed))
        if root is None:
            root = self._roots[algo, seed] = none_hash(algo, seed)
        width = 8 * block_size
        ctx = (algo, seed, block_size, salt, None if lora is None else tuple(lora))
        young, old = self._young, self._old
        out: list[bytes] = []
        for i in range(n):
            key = (ctx, out[-1] if i else root, raw[i * width:(i + 1) * width])
            h = young.get(key)
            if h is None:
                h = old.get(key)
                if h is None:
                    break
                self._store(key, h)  # promote: it is in use
            out.append(h)
        done = len(out)
        self.hits += done
        if done < n:
            extend_block_hashes(out, token_ids, block_size, algo=algo, seed=seed, salt=salt,
                                lora=lora)
            self.misses += n - done
            for i in range(done, n):
                key = (ctx, out[i - 1] if i else root, raw[i * width:(i + 1) * width])
                self._store(key, out[i])
        return out
