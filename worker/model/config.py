"""Model hyper-parameters read from a Hugging Face ``config.json``.

`ModelConfig` is the only description of the network the rest of ``worker/model`` relies on.
It is built from the raw JSON dict (no dependency on ``transformers``) and accepts both the
transformers 4 layout (``rope_theta`` + ``rope_scaling`` at the top level) and the
transformers 5 layout (``rope_parameters`` holding ``rope_type``, ``rope_theta`` and the
scaling fields).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

SUPPORTED_ARCHITECTURES: tuple[str, ...] = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
)

# RoPE variants the model implements; anything else is refused rather than silently wrong.
SUPPORTED_ROPE_TYPES: tuple[str, ...] = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. ``rope_type`` is one of `SUPPORTED_ROPE_TYPES`.

    ``linear`` divides every inverse frequency by ``factor``; ``llama3`` divides only the low
    frequencies and interpolates the band between ``low_freq_factor`` and
    ``high_freq_factor`` (wavelengths measured against ``original_max_position_embeddings``).
    """

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and constants of a Llama-family decoder.

    Invariants: ``num_attention_heads % num_key_value_heads == 0`` and ``head_dim`` is even.
    ``attention_bias`` puts biases on q/k/v (always for Qwen2), ``o_proj_bias`` on the output
    projection (Llama's ``attention_bias`` covers both; Qwen2's o_proj has none).
    ``eos_token_ids`` is a tuple (a checkpoint may list several end tokens); it may be empty.
    ``sliding_window`` is recorded but not implemented (attention is always full).
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    torch_dtype: str | None = None
    sliding_window: int | None = None

    @property
    def q_size(self) -> int:
        """Width of the query projection (``num_attention_heads * head_dim``)."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of each of the key and value projections."""
        return self.num_key_value_heads * self.head_dim

    def kv_cache_bytes_per_block(self, block_size: int, dtype: torch.dtype) -> int:
        """Bytes one KV block takes over all layers (K and V); use it to size the pool."""
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * self.num_hidden_layers * block_size * self.kv_size * elem

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Build from a parsed ``config.json``.

        Raises ``ValueError`` for an unsupported architecture or RoPE type, or inconsistent
        head counts.
        """
        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(
                f"unsupported architecture {archs or raw.get('model_type')!r}; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        heads = int(raw["num_attention_heads"])
        kv_heads = int(raw.get("num_key_value_heads") or heads)
        hidden = int(raw["hidden_size"])
        head_dim = int(raw.get("head_dim") or hidden // heads)
        if heads % kv_heads != 0:
            raise ValueError(f"num_attention_heads={heads} not a multiple of kv heads={kv_heads}")
        if head_dim % 2 != 0:
            raise ValueError(f"head_dim={head_dim} must be even for RoPE")
        max_pos = int(raw.get("max_position_embeddings", 2048))
        theta, scaling = _parse_rope(raw, max_pos)
        eos = raw.get("eos_token_id")
        eos_ids = tuple(int(e) for e in eos) if isinstance(eos, list) else (
            () if eos is None else (int(eos),)
        )
        return cls(
            architecture=arch,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            max_position_embeddings=max_pos,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases; Llama/Mistral only when attention_bias is set.
            attention_bias=arch == "Qwen2ForCausalLM" or bool(raw.get("attention_bias", False)),
            o_proj_bias=arch != "Qwen2ForCausalLM" and bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
            pad_token_id=raw.get("pad_token_id"),
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
            sliding_window=_sliding_window(raw, max_pos),
        )

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        """Read ``path`` (a ``config.json`` or a directory holding one)."""
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        with p.open() as f:
            return cls.from_dict(json.load(f))


def _sliding_window(raw: dict[str, Any], max_pos: int) -> int | None:
    """The attention window when one is in force and shorter than the context, else None.
    (Qwen2 configs carry a window but switch it off with ``use_sliding_window: false``.)"""
    window = raw.get("sliding_window")
    if window is None or not raw.get("use_sliding_window", True) or int(window) >= max_pos:
        return None
    return int(window)


def _parse_rope(raw: dict[str, Any], max_pos: int) -> tuple[float, RopeScaling]:
    """Return (theta, scaling) from either the v5 ``rope_parameters`` or v4 fields."""
    params = raw.get("rope_parameters") or {}
    if params and all(isinstance(v, dict) for v in params.values()):
        # Per-layer-type nesting ({"full_attention": {...}}); these models use one kind.
        params = next(iter(params.values()))
    legacy = raw.get("rope_scaling") or {}
    merged = {**legacy, **params}
    theta = float(merged.get("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"unsupported rope_type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if rope_type == "default":
        return theta, RopeScaling()
    orig = merged.get("original_max_position_embeddings") or raw.get(
        "original_max_position_embeddings", max_pos
    )
    return theta, RopeScaling(
        rope_type=rope_type,
        factor=float(merged["factor"]),
        low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
        high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(orig),
    )
