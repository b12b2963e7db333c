"""Rotary position embedding (RoPE), HF `rotate_half` convention, from a precomputed cos/sin cache.

The cache holds one row per position, [cos | sin] of the half-size frequencies; a step indexes it
once (RotaryEmbedding.forward) and every layer reuses the result in apply_rotary_emb. Frequencies
follow HF bit for bit (same formula, fp32), so fp32 logits match transformers to rounding.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from pagedcore.ops import elementwise


def inverse_frequencies(head_dim: int, theta: float, rope_scaling: dict[str, Any] | None) -> torch.Tensor:
    """fp32 [head_dim // 2]: theta ** (-2i / head_dim), rescaled as rope_scaling says."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope_scaling is None:
        return inv_freq
    if rope_scaling["rope_type"] == "linear":
        return inv_freq / rope_scaling["factor"]
    return _llama3_inverse_frequencies(inv_freq, rope_scaling)


def _llama3_inverse_frequencies(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 long-context RoPE: wavelengths longer than the original context / low_freq_factor are
    stretched by `factor`, shorter than context / high_freq_factor kept, and the band between
    interpolated smoothly."""
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor

    wavelen = 2 * math.pi / inv_freq  # [head_dim // 2]
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, theta: float,
                 rope_scaling: dict[str, Any] | None, dtype: torch.dtype):
        super().__init__()
        self.head_dim = head_dim
        self.max_position = max_position
        self.inv_freq = inverse_frequencies(head_dim, theta, rope_scaling)  # fp32 [head_dim // 2]
        cache = self._build_cache().to(dtype)  # cos/sin in fp32, rounded once, as HF does
        self.register_buffer("cos_sin_cache", cache, persistent=False)  # [max_position, head_dim]

    def _build_cache(self) -> torch.Tensor:
        positions = torch.arange(self.max_position, dtype=torch.int64).float()  # [max_position]
        freqs = positions[:, None] * self.inv_freq[None, :]  # fp32 [max_position, head_dim // 2]
        return torch.cat((freqs.cos(), freqs.sin()), dim=-1)  # fp32 [max_position, head_dim]

    def apply_freq_factors(self, freq_factors: torch.Tensor) -> None:
        """Llama 3 GGUF files store the rescaling as divisors of each frequency (`rope_freqs`)."""
        self.inv_freq = self.inv_freq / freq_factors.float().reshape(-1)
        self.cos_sin_cache = self._build_cache().to(self.cos_sin_cache)  # keeps its dtype and device

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        """positions int64 [num_tokens] -> cos_sin [num_tokens, head_dim]: each row [cos | sin] of
        its position. Called once per step; every layer reuses it in apply_rotary_emb."""
        return self.cos_sin_cache.index_select(0, positions)


def apply_rotary_emb(x: torch.Tensor, cos_sin: torch.Tensor) -> None:
    """Rotates x [num_tokens, num_heads, head_dim] in place; cos_sin [num_tokens, head_dim] from
    RotaryEmbedding.forward.

    q and k may be one view of the fused qkv output, so both rotate in one call. The products and
    sums are HF's x * cos + rotate_half(x) * sin term for term, so results are bit-identical to it
    (on the CPU one fused kernel call, pagedcore.ops.elementwise.rotary_embedding; else torch ops).
    """
    if x.is_cpu:
        elementwise.rotary_embedding(x, cos_sin)
        return
    half = x.shape[-1] // 2
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]  # [num_tokens, 1, head_dim // 2]
    x1 = x[..., :half]  # [num_tokens, num_heads, head_dim // 2]
    x2 = x[..., half:]
    x1_sin = x1 * sin  # taken before x1 is overwritten
    new_x1 = (x1 * cos).sub_(x2 * sin)
    x2.mul_(cos).add_(x1_sin)
    x1.copy_(new_x1)
