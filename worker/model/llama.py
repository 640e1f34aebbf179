"""Llama-family decoder (Llama, Mistral, Qwen2) over a paged KV cache.

The network is the usual pre-norm stack: RMSNorm -> GQA self-attention with RoPE (optional
q/k/v bias) -> residual -> RMSNorm -> SwiGLU MLP -> residual, a final RMSNorm and an lm_head
(tied to the embeddings or not). q/k/v and gate/up are stored fused (``qkv_proj``,
``gate_up_proj``); `stacked_params` tells the loader where each Hugging Face tensor goes.

The model is stateless between steps: all per-request state lives in the KV cache, passed in
by the caller with the step's `AttentionMetadata`. Inputs are flattened (no batch dimension,
no padding): ``input_ids`` ``[T]`` are the step's new tokens of every sequence back to back.

Dtypes: fp32 on CPU. On CUDA the same code runs in bf16/fp16 (weights and cache in that
dtype, RMSNorm and RoPE tables computed in fp32, logits returned in fp32); CI has no GPU, so
that path is written for but not exercised by the tests.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from worker.model.attention import AttentionMetadata, paged_attention
from worker.model.config import ModelConfig
from worker.model.rope import RotaryEmbedding

# HF sub-module name -> (fused module name, shard index).
STACKED: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class RMSNorm(nn.Module):
    """``weight * x / rms(x)``, the statistics taken in fp32."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class FusedLinear(nn.Linear):
    """A linear layer whose output rows are the concatenation of ``shard_sizes`` shards."""

    def __init__(self, in_features: int, shard_sizes: Sequence[int], bias: bool):
        super().__init__(in_features, sum(shard_sizes), bias=bias)
        self.shard_sizes = tuple(shard_sizes)

    def shard(self, tensor: torch.Tensor, index: int) -> torch.Tensor:
        """The rows of ``tensor`` (this layer's weight or bias) that belong to shard ``index``."""
        start = sum(self.shard_sizes[:index])
        return tensor.narrow(0, start, self.shard_sizes[index])


class Attention(nn.Module):
    """GQA self-attention; K/V go through the paged cache (see `paged_attention`)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        self.qkv_proj = FusedLinear(
            cfg.hidden_size, (cfg.q_size, cfg.kv_size, cfg.kv_size), bias=cfg.attention_bias
        )
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=cfg.o_proj_bias)
        self.scale = cfg.head_dim**-0.5

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.qkv_proj.shard_sizes, dim=-1)
        q = RotaryEmbedding.apply(q.view(t, self.heads, self.head_dim), cos, sin)
        k = RotaryEmbedding.apply(k.view(t, self.kv_heads, self.head_dim), cos, sin)
        v = v.view(t, self.kv_heads, self.head_dim)
        o = paged_attention(q, k, v, k_cache, v_cache, meta, scale=self.scale)
        return self.o_proj(o.reshape(t, self.heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        size = cfg.intermediate_size
        self.gate_up_proj = FusedLinear(cfg.hidden_size, (size, size), bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, meta, k_cache, v_cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    """The decoder. Parameter names are the HF ones without the ``model.`` prefix, except
    the fused ``qkv_proj`` / ``gate_up_proj`` (see `STACKED`)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(
            cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling
        )
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the embedding matrix with the lm_head when the config says so."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: torch.Tensor | Sequence[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """Run the step's ``T`` new tokens; return the final-norm hidden states ``[T, H]``.

        ``positions`` ``[T]`` is normally ``meta.positions``. ``kv_caches[layer]`` yields
        ``(k_cache, v_cache)``: either the tensor from `allocate_kv_cache` or a list of
        pairs. The new tokens' K/V are written into the cache before attention reads it.
        """
        h = self.embed_tokens(input_ids)
        cos, sin = self.rotary.lookup(positions, meta.max_seq_len)
        for layer, kv in zip(self.layers, kv_caches, strict=True):
            h = layer(h, cos, sin, meta, kv[0], kv[1])
        return self.norm(h)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[N, H]`` hidden states (e.g. ``hidden[meta.last_token_indices]``) -> fp32
        logits ``[N, vocab]``."""
        return self.lm_head(hidden).float()

    def allocate_kv_cache(
        self,
        num_blocks: int,
        block_size: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """Zeroed cache ``[layers, 2, num_blocks, block_size, kv_heads, head_dim]``.

        ``cache[layer, 0]`` / ``cache[layer, 1]`` are that layer's K / V, contiguous views
        of ``[num_blocks, block_size, kv_heads, head_dim]``. Defaults to the model's device
        and dtype. Zeros keep never-written slots finite (padding is masked, not skipped).
        """
        cfg = self.config
        shape = (
            cfg.num_hidden_layers,
            2,
            num_blocks,
            block_size,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        return torch.zeros(shape, device=device or self.device, dtype=dtype or self.dtype)
