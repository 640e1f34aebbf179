"""The extra keys of a prompt on the wire (LoRA, multimodal items, salt), checked once for
every worker call that names a prompt (``Generate``, ``Pin``), so both hash it alike."""
from __future__ import annotations

from typing import Any

from kvmesh.hashing import Lora, MMItem, lora_key

MAX_SALT_BYTES = 4096


def prompt_keys(request: Any, max_mm_items: int) -> tuple[Lora | None, tuple[MMItem, ...]]:
    """``(lora, mm)`` of a request carrying ``lora``, ``mm`` and ``salt`` fields. Raises
    ``ValueError`` (the caller answers INVALID_ARGUMENT) for a path without a LoRA name,
    too many multimodal items, an item without a positive length, or a salt over
    :data:`MAX_SALT_BYTES`."""
    # the service's definition too, so both hash an empty-named Lora alike
    lora = lora_key(request.lora.name, request.lora.path)
    if len(request.mm) > max_mm_items:
        raise ValueError(f"{len(request.mm)} multimodal items; the limit is {max_mm_items} "
                         "per request")
    mm = tuple((m.identifier, m.offset, m.length) for m in request.mm)
    if any(m.length <= 0 for m in request.mm):
        raise ValueError("multimodal items need a positive length")
    salt_bytes = len(request.salt.encode())
    if salt_bytes > MAX_SALT_BYTES:
        raise ValueError(f"salt is {salt_bytes} bytes; the limit is {MAX_SALT_BYTES}")
    return lora, mm
