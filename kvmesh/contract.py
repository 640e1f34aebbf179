"""The names every layer shares, written once: KV tiers, eviction orders, routing policies,
block-hash algorithms and their digest sizes, the tiers' proto enum values, and the model
fingerprint's definition.

Every other module imports them from here and none types them again:
``tests/kvmesh/test_contract.py`` reads the source packages with ``ast`` and fails on a copy
(a tuple of tier names, an algorithm or policy name as a literal). They are wire contract
(``Tier`` in ``index.proto``, ``RouteRequest.policy``, ``hash_algo`` in every index
namespace, the disk tier's fingerprint directory): change one here, with the proto and the
docs, never in a caller.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from kvmesh.v1 import index_pb2

# --- tiers and eviction orders ------------------------------------------------------------
# A worker holds KV blocks in up to three tiers, fastest first: ``gpu`` (the device pool the
# model reads; the name stays ``gpu`` on a CPU-only worker), ``cpu`` (host memory), ``disk``
# (files). The order is the contract: faster tiers win a match, events and stats list them so.
TIERS = ("gpu", "cpu", "disk")
LOWER_TIERS = TIERS[1:]  # where the device pool's evicted blocks go, and are onboarded from
# Where a request's cached prompt tokens came from (``cached_tokens_by_tier``): a tier of the
# worker that ran it, or ``peer``: blocks another worker sent it for this request.
PEER = "peer"
CACHE_SOURCES = (*TIERS, PEER)
# ``index.proto``'s ``Tier`` value of each tier; derived from the enum's names, so a renamed
# or missing value fails at import instead of mapping a tier to the wrong wire number.
TIER_PB: dict[str, int] = {t: index_pb2.Tier.Value(f"TIER_{t.upper()}") for t in TIERS}
PB_TIER: dict[int, str] = {v: t for t, v in TIER_PB.items()}
# The orders in which the device pool hands out free cached blocks: ``lru`` (vLLM's) or
# ``layered`` (decode-generated blocks before prefill-computed ones).
EVICTIONS = ("lru", "layered")

# --- routing policies (``RouteRequest.policy`` names one; ``service/policy/`` runs them) ----
KVMESH, PREFIX_ONLY, CONSISTENT_HASH = "kvmesh", "prefix_only", "consistent_hash"
LEAST_LOADED, ROUND_ROBIN, RANDOM = "least_loaded", "round_robin", "random"
DEFAULT_POLICY = KVMESH
POLICIES = (KVMESH, PREFIX_ONLY, CONSISTENT_HASH, LEAST_LOADED, ROUND_ROBIN, RANDOM)

# --- block-hash algorithms (vLLM's ``--prefix-caching-hash-algo`` names; kvmesh.hashing) ---
SHA256, SHA256_CBOR, XXHASH, XXHASH_CBOR = "sha256", "sha256_cbor", "xxhash", "xxhash_cbor"
ALGOS = (SHA256, SHA256_CBOR, XXHASH, XXHASH_CBOR)
DEFAULT_ALGO = SHA256_CBOR  # canonical CBOR: reproducible in any language
CBOR_ALGOS = frozenset({SHA256_CBOR, XXHASH_CBOR})  # canonical CBOR; the others pickle
SHA256_ALGOS = frozenset({SHA256, SHA256_CBOR})  # SHA-256 digests; the others xxh3_128
# A block hash's length in bytes, per algorithm: the service refuses any other length.
DIGEST_BYTES = {a: 32 if a in SHA256_ALGOS else 16 for a in ALGOS}

# --- the model fingerprint: "KV computed here is valid there" ----------------------------
FINGERPRINT_BYTES = 16
_FINGERPRINT_VERSION = 2  # 1: the worker's disk tier's first fingerprint (shapes only, xxh3)


def kv_fingerprint(config: Mapping[str, Any], *, architecture: str, dtype: str,
                   block_size: int, hash_algo: str, root_hash: bytes,
                   weight_sample: bytes) -> bytes:
    """``FINGERPRINT_BYTES`` bytes naming everything a KV block's bytes depend on besides its
    tokens; two places may exchange KV (a restarted worker reading its disk tier, a worker
    pulling blocks from another) only when their fingerprints are equal.

    Contract: the input is the WHOLE parsed model config (JSON-able values: dicts, lists,
    tuples, str, int, float, bool, None), not a chosen list of fields, so a field added later
    is covered; it is written as canonical JSON (sorted keys, no whitespace, tuples as
    arrays), so equal inputs give equal bytes in every process and language. ``weight_sample``
    is bytes the caller draws from the weights (``worker.model.fingerprint.weight_sample``),
    digested here; ``dtype`` is the KV cache's element type as text (``"torch.bfloat16"``).
    The document carries a version: bump it when the definition changes, never reuse one.
    Raises ``TypeError`` for a value JSON cannot write and ``ValueError`` for a block size
    below 1. Torch-free: the worker, the vLLM bridge and the service may all compute it."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    doc = {
        "v": _FINGERPRINT_VERSION,
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
