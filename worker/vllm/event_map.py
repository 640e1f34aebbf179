"""A kvmesh pool's KV events as vLLM publishes its own (``kvmesh.events.vllm`` structs).

A translation, not a renaming: vLLM removes every physical copy, so a removal is published
once per stored copy; vLLM's events carry the untagged extra keys, read from the pool when
the event is taken. A block whose keys cannot be found is not published (nor its later
removal): a consumer may miss a block, never hold one the pool does not. Not thread-safe.

See docs/architecture.md#worker-vllm-face.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvmesh.events import vllm as ve
from kvmesh.events.pool import PoolCleared, PoolEvent, PoolRemoved, PoolStored
from worker.kv_cache import KVCacheManager

# What vLLM publishes for one block: (lora_name, extra_keys entry).
Published = tuple[str | None, tuple[Any, ...] | None]


def untagged(extra: Sequence[tuple[Any, ...]] | None) -> Published:
    """kvmesh's tagged extra keys of one block -> (LoRA name, vLLM's untagged entry).

    ``("lora", name, path)`` -> ``name``; ``("mm", id, offset)`` -> ``(id, offset)``;
    ``("cache_salt", salt)`` -> ``salt``; in kvmesh's order, which is vLLM's. Raises
    ``ValueError`` for a key of another shape."""
    if not extra:
        return None, None
    lora: str | None = None
    out: list[Any] = []
    for key in extra:
        if key[0] == "lora" and len(key) == 3:
            lora = key[1]
            out.append(key[1])
        elif key[0] == "mm" and len(key) == 3:
            out.append((key[1], key[2]))
        elif key[0] == "cache_salt" and len(key) == 2:
            out.append(key[1])
        else:
            raise ValueError(f"unknown extra key {key!r:.80}")
    return lora, tuple(out)


class VllmEventMap:
    """Translates one pool's events, step by step, keeping the copy counts and keys."""

    def __init__(self, block_size: int, *, as_int: bool = True) -> None:
        self.block_size = block_size
        self.as_int = as_int
        self.copies: dict[tuple[str, bytes], int] = {}  # published copies per (tier, hash)
        self.keys: dict[bytes, Published] = {}  # per hash held on some tier
        self.tiers_of: dict[bytes, int] = {}  # tiers holding a published hash
        self.unpublished = 0  # blocks left out (keys not found)

    def _ext(self, h: bytes) -> ve.ExternalBlockHash:
        return ve.external_hash(h, self.as_int)

    def translate(self, kv: KVCacheManager, events: Sequence[PoolEvent],
                  lost: bool = False) -> list[ve.VllmEvent]:
        """vLLM's events for ``events`` (taken from ``kv`` just now), in order."""
        out: list[ve.VllmEvent] = []
        if lost:
            self._clear()
            out.append(ve.VllmCleared())
        for event in events:
            if isinstance(event, PoolStored):
                stored = self._stored(kv, event)
                if stored is not None:
                    out.append(stored)
            elif isinstance(event, PoolRemoved):
                removed = self._removed(event)
                if removed is not None:
                    out.append(removed)
            elif isinstance(event, PoolCleared):
                self._clear()
                out.append(ve.VllmCleared())
        return out

    def _clear(self) -> None:
        self.copies.clear()
        self.keys.clear()
        self.tiers_of.clear()

    def _stored(self, kv: KVCacheManager, event: PoolStored) -> ve.VllmStored | None:
        bs = self.block_size
        hashes: list[bytes] = []
        entries: list[tuple[Any, ...] | None] = []
        lora: str | None = None
        for i, h in enumerate(event.block_hashes):
            tokens = tuple(event.token_ids[i * bs:(i + 1) * bs])
            found = self.keys.get(h) or _lookup(kv, h, tokens)
            if found is None or (i and found[0] != lora):
                self.unpublished += len(event.block_hashes) - i
                break  # the rest chains from this block: leave it out too
            lora = found[0]
            hashes.append(h)
            entries.append(found[1])
            self.keys[h] = found
        if not hashes:
            return None
        for h in hashes:
            key = (event.tier, h)
            if key not in self.copies:
                self.tiers_of[h] = self.tiers_of.get(h, 0) + 1
            self.copies[key] = self.copies.get(key, 0) + 1
        parent = event.parent_hash
        return ve.VllmStored(
            block_hashes=[self._ext(h) for h in hashes],
            parent_block_hash=None if parent is None else self._ext(parent),
            token_ids=list(event.token_ids[:len(hashes) * bs]), block_size=bs, lora_id=None,
            medium=ve.MEDIUMS[event.tier], lora_name=lora,
            extra_keys=entries)

    def _removed(self, event: PoolRemoved) -> ve.VllmRemoved | None:
        out: list[ve.ExternalBlockHash] = []
        for h in event.block_hashes:
            n = self.copies.pop((event.tier, h), 0)
            if not n:
                continue  # never published (its keys were not found)
            out.extend([self._ext(h)] * n)
            left = self.tiers_of.pop(h) - 1
            if left:
                self.tiers_of[h] = left
            else:
                self.keys.pop(h, None)
        if not out:
            return None
        return ve.VllmRemoved(block_hashes=out, medium=ve.MEDIUMS[event.tier])


def _lookup(kv: KVCacheManager, h: bytes, tokens: tuple[int, ...]) -> Published | None:
    """The keys of the block ``kv`` holds under ``h`` with ``tokens`` (any tier: the block
    may have moved on within the step), or ``None``."""
    contents = [b.content for b in kv.pool.cached.get(h, {}).values()]
    offloader = kv.offloader
    if offloader is not None:
        contents += [entry.content for t in offloader.tiers if (entry := t.get(h)) is not None]
    for content in contents:
        if content is not None and content.token_ids == tokens:
            try:
                return untagged(content.extra_keys)
            except ValueError:
                return None
    return None
