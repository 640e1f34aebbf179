"""The worker's side of the model fingerprint: the inputs of ``kvmesh.contract.kv_fingerprint``.

The definition lives in ``kvmesh.contract`` (torch-free, shared with every layer that
compares fingerprints); this module only gathers its inputs from a loaded model: the whole
parsed :class:`~worker.model.config.ModelConfig` (RoPE, norms, context, biases, ... all of
it), its architecture, and a sample of the weights.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from kvmesh.contract import kv_fingerprint

_SAMPLE = 64  # leading elements of every parameter: cheap whatever the model's size


def weight_sample(model: torch.nn.Module) -> bytes:
    """The first ``_SAMPLE`` elements of every parameter (as float32), named, in name order:
    tells two checkpoints of the same shapes apart without reading all the weights."""
    parts = []
    for name, p in sorted(model.named_parameters()):
        if p.dim() >= 1:
            sample = p.detach().reshape(-1)[:_SAMPLE].to("cpu", torch.float32).contiguous()
            parts += [name.encode(), b"\x00", sample.numpy().tobytes()]
    return b"".join(parts)


def config_fields(config: Any) -> dict[str, Any]:
    """Every field of the parsed config as JSON-able values (a dataclass or a mapping)."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    if isinstance(config, Mapping):
        return dict(config)
    raise TypeError(f"a model config must be a dataclass or a mapping, not "
                    f"{type(config).__name__}")


def model_fingerprint(model: torch.nn.Module, config: Any, block_size: int,
                      dtype: torch.dtype, hash_algo: str, root_hash: bytes) -> bytes:
    """:func:`kvmesh.contract.kv_fingerprint` of a loaded model: its whole parsed
    ``config`` and architecture, the KV cache ``dtype``, ``block_size``, the hash algorithm
    and root hash (the seed), and :func:`weight_sample`."""
    fields = config_fields(config)
    return kv_fingerprint(
        fields, architecture=str(fields.get("architecture", type(model).__name__)),
        dtype=str(dtype), block_size=block_size, hash_algo=hash_algo, root_hash=root_hash,
        weight_sample=weight_sample(model))
