"""The model fingerprint: the one definition of "KV computed here is valid there".

A KV block's bytes depend on its tokens (named by the block hash) and on everything else the
forward pass that wrote them read: the network's shape, every constant of the parsed model
config (``rope_theta``, ``rope_scaling``, ``rms_norm_eps``, ``max_position_embeddings``, ...),
the architecture, the weights, the cache dtype, the block size that lays the bytes out, and
the hash algorithm and root hash that decide which hash names which tokens. Two places may
exchange KV (a restarted worker reading its disk tier, one worker pulling blocks from
another) only when their fingerprints are equal; anything that differs in any of those
inputs gives another fingerprint.

Contract (:func:`kv_fingerprint`):

- the input is the WHOLE parsed model config, not a chosen list of fields: a field added to
  the config later is covered without touching this function. It is written as canonical
  JSON (sorted keys, no whitespace, tuples as arrays), so equal configs give equal bytes in
  every process and every language;
- the weights enter as ``weight_sample``: bytes the caller draws from the weights (the
  worker's :func:`worker.model.fingerprint.weight_sample`), digested here;
- the result is ``FINGERPRINT_BYTES`` bytes of SHA-256 over that document. Changing what
  goes in changes every fingerprint, so the document carries a version (``v``): bump it when
  the definition changes, never reuse one.

Torch-free on purpose: the worker, the vLLM bridge and the service may all compute or compare it.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

FINGERPRINT_BYTES = 16
_VERSION = 2  # 1: the worker's disk tier's first fingerprint (shapes only, xxh3)


def kv_fingerprint(config: Mapping[str, Any], *, architecture: str, dtype: str,
                   block_size: int, hash_algo: str, root_hash: bytes,
                   weight_sample: bytes) -> bytes:
    """``FINGERPRINT_BYTES`` bytes naming everything a KV block's bytes depend on besides
    its tokens (see the module docstring).

    ``config``: the parsed model config as JSON-able values (dicts, lists, tuples, str,
    int, float, bool, None); ``architecture``: e.g. ``"LlamaForCausalLM"``; ``dtype``: the
    KV cache's element type as text (``"torch.bfloat16"``). Raises ``TypeError`` for a
    config value JSON cannot write (a caller error: convert it first) and ``ValueError``
    for a block size below 1."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    doc = {
        "v": _VERSION,
        "config": dict(config),
        "architecture": architecture,
        "dtype": dtype,
        "block_size": int(block_size),
        "hash_algo": hash_algo,
        "root_hash": bytes(root_hash).hex(),
        "weights": hashlib.sha256(weight_sample).hexdigest(),
    }
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).digest()[:FINGERPRINT_BYTES]
