"""vLLM's published extra keys -> kvmesh's tagged extra keys, for one block.

vLLM publishes the keys it hashed untagged; kvmesh hashes ``("lora", name, path)``,
``("mm", id, offset)``, ``("cache_salt", salt)``. A block whose keys cannot be rebuilt exactly
(an unmapped adapter, prompt embeddings, an unknown shape) is never indexed, with its reason.

See docs/architecture.md#bridge-engine-state.
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
