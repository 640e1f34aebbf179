"""Rotary position embedding (RoPE) with the Llama 3 and linear frequency scalings.

The cos/sin table covers every position up to the model's context and is computed once per
device in fp32 (as Hugging Face does), then indexed by the step's positions once per forward
pass and shared by all layers. It is cast to the activations' dtype only when applied.
"""

from __future__ import annotations

import math

import torch

from worker.model.config import RopeScaling


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """Return the ``head_dim // 2`` inverse frequencies (fp32, CPU) after scaling."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type != "llama3":
        return inv_freq
    factor = scaling.factor
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    old_ctx = scaling.original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths (low frequencies) are slowed down by `factor`, short ones are kept,
    # and the band in between is interpolated linearly in 1/wavelength.
    scaled = torch.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
    return torch.where(medium, blended, scaled)


class RotaryEmbedding(torch.nn.Module):
    """Holds the cos/sin table; `lookup` once per step, `apply` in every layer.

    The table is a plain attribute rather than a buffer so that it is never part of the
    state dict and survives ``to_empty``; it is rebuilt lazily on the device it is used on
    and grown if a step needs positions beyond ``max_positions``.
    """

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: RopeScaling):
        super().__init__()
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.theta = theta
        self.scaling = scaling
        self._cos: torch.Tensor | None = None
        self._sin: torch.Tensor | None = None

    def _build(self, n: int, device: torch.device) -> None:
        inv_freq = inverse_frequencies(self.head_dim, self.theta, self.scaling).to(device)
        pos = torch.arange(n, device=device, dtype=torch.float32)
        freqs = torch.outer(pos, inv_freq)  # [n, head_dim // 2]
        self._cos, self._sin = freqs.cos(), freqs.sin()

    def lookup(
        self, positions: torch.Tensor, max_position: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return fp32 (cos, sin), each ``[T, head_dim // 2]``, for ``positions`` ``[T]``.

        ``max_position`` is a host-side upper bound (exclusive) on ``positions`` so no
        device sync is needed to decide whether the table must grow.
        """
        need = max(self.max_positions, max_position)
        if self._cos is None or self._cos.device != positions.device or self._cos.shape[0] < need:
            self._build(need, positions.device)
        assert self._cos is not None and self._sin is not None
        return self._cos[positions], self._sin[positions]

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` ``[T, heads, head_dim]`` (half-split layout, as in HF Llama)."""
        cos = cos.to(x.dtype).unsqueeze(1)
        sin = sin.to(x.dtype).unsqueeze(1)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
