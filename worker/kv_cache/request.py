"""The request state the KV cache manager reads: tokens, progress, and the hash chain."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvmesh.hashing import Lora, MMItem


@dataclass(eq=False)
class KVRequest:
    """One sequence as the KV cache manager sees it.

    Owned and updated by the engine:

    - ``token_ids``: prompt then generated tokens; append-only (the engine appends each
      sampled token).
    - ``num_computed_tokens``: tokens whose KV is in the request's blocks once the current
      step has run. The engine adds ``num_new_computed_tokens + num_new_tokens`` after a
      successful :meth:`KVCacheManager.allocate_slots`, and sets it back to 0 on preemption
      (:meth:`KVCacheManager.preempt` does that).
    - ``num_preemptions``: how often the request was preempted; re-admissions of a preempted
      request are counted apart in the prefix-cache stats (as vLLM does).

    Owned by the manager: ``block_hashes``, the hash chain of the full blocks of
    ``token_ids``, extended incrementally (each block is hashed once). ``salt``, ``lora``
    and ``mm`` are the extra keys of the chain (see :mod:`kvmesh.hashing`) and must not change.
    """

    request_id: str
    token_ids: list[int]
    salt: str | None = None
    lora: Lora | None = None
    mm: Sequence[MMItem] = ()
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    block_hashes: list[bytes] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def has_extra_keys(self) -> bool:
        """Whether any block's hash input carries extra keys (salt, LoRA, multimodal)."""
        return bool(self.salt) or self.lora is not None or bool(self.mm)
