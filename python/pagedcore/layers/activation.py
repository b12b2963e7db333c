"""The SwiGLU activation of Llama-family MLPs, on the output of the fused gate/up projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [num_tokens, 2 * intermediate] (gate rows first) -> silu(gate) * up [num_tokens, intermediate]."""
    half = gate_up.shape[-1] // 2
    out = F.silu(gate_up[..., :half])  # new contiguous [num_tokens, intermediate]
    return out.mul_(gate_up[..., half:])
