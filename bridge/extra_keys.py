"""vLLM's published extra keys -> kvmesh's tagged extra keys, for one block.

vLLM hashes a block with extra keys (LoRA, multimodal items, cache salt, prompt embeddings) but
publishes them untagged in ``VllmStored.extra_keys``, one entry per block, in this order: the
LoRA name (a bare string, every block of a LoRA request), ``(mm_identifier, offset)`` pairs
(offset relative to the block start, may be negative), the cache salt (a bare string, block 0
only), prompt-embedding digests (bytes). kvmesh hashes ``("lora", name, path)``, ``("mm",
identifier, offset)``, ``("cache_salt", salt)`` in that order (``kvmesh/hashing.py``), so the
bridge rebuilds those from the published keys.

Exactness rules (a block the bridge cannot rebuild exactly is never indexed: the index may
under-claim an engine's cache, never over-claim it):

- LoRA: events carry the adapter NAME only (``lora_name``); kvmesh's key also needs the PATH.
  The bridge is given a map ``--lora NAME=PATH`` per engine (the adapters that engine loads;
  vLLM identifies an adapter by its name, so within one engine a name means one path). A block
  of an adapter missing from the map is not indexed (``unknown_lora``), and neither is one that
  only carries the deprecated ``lora_id`` (``lora_without_name``). A router then routes a LoRA
  request exactly when it names the same (name, path) the operator mapped.
- The salt: a bare string on block 0 that is not the LoRA name (when salt and LoRA name are
  equal, the first occurrence is the LoRA's, as vLLM writes LoRA first). A bare string anywhere
  else cannot be placed: ``extra_key``.
- Prompt-embedding digests (bytes): kvmesh requests are token ids, so no request can ever match
  such a block: ``prompt_embeds``.
- Any other shape (a key a later vLLM adds): ``extra_key``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvmesh.hashing import Extra, Lora


class Unroutable(ValueError):
    """A block whose kvmesh hash cannot be rebuilt exactly; ``reason`` names why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def event_lora(lora_name: str | None, lora_id: int | None,
               loras: Mapping[str, str]) -> Lora | None:
    """The (name, path) of a ``VllmStored``'s adapter; ``None`` without one.

    Raises ``Unroutable`` for an adapter the map does not name."""
    if lora_name is None:
        if lora_id is not None:
            raise Unroutable("lora_without_name")
        return None
    path = loras.get(lora_name)
    if path is None:
        raise Unroutable("unknown_lora")
    return (lora_name, path)


def block_extra(keys: Sequence[Any] | None, lora: Lora | None, first_block: bool) -> Extra:
    """kvmesh's extra keys for one block, from the block's published ``keys``.

    ``first_block``: the block is block 0 of its chain (the only one that can carry a salt).
    Raises ``Unroutable`` for a key that cannot be rebuilt exactly."""
    lora_seen = False
    salt: str | None = None
    mm: list[tuple[str, str, int]] = []
    for key in keys or ():
        if isinstance(key, str):
            if lora is not None and not lora_seen and key == lora[0]:
                lora_seen = True
            elif first_block and salt is None and key:
                salt = key
            else:
                raise Unroutable("extra_key")
        elif (isinstance(key, list | tuple) and len(key) == 2 and isinstance(key[0], str)
              and isinstance(key[1], int) and not isinstance(key[1], bool)):
            mm.append(("mm", key[0], key[1]))
        elif isinstance(key, bytes):
            raise Unroutable("prompt_embeds")
        else:
            raise Unroutable("extra_key")
    out: list[tuple[Any, ...]] = []
    if lora is not None:
        out.append(("lora", lora[0], lora[1]))
    out.extend(mm)
    if salt is not None:
        out.append(("cache_salt", salt))
    return tuple(out) if out else None
