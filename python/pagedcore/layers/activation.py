"""The SwiGLU activation of Llama-family MLPs, on the output of the fused gate/up projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagedcore.ops.dtypes import CPU_DTYPE_CODES as _DTYPE_CODES


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [num_tokens, 2 * intermediate] (gate rows first) -> silu(gate) * up [num_tokens, intermediate]."""
    half = gate_up.shape[-1] // 2
    out = F.silu(gate_up[..., :half])  # new contiguous [num_tokens, intermediate]
    return out.mul_(gate_up[..., half:])


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu_and_mul, computed by the linear kernel's own SwiGLU epilogue (cpp/kernels/silu_mul.h) for a
    2-D fp32/bf16 CPU tensor with contiguous rows: the bits of the fused gate_up + SwiGLU kernel, and
    of the C++ decoder stack's LoRA steps (it calls the same code after gate_up's adapter terms).
    Other tensors (GPU, other dtypes) go through torch (silu_and_mul)."""
    if not (gate_up.dim() == 2 and gate_up.is_cpu and gate_up.dtype in _DTYPE_CODES and gate_up.stride(1) == 1
            and gate_up.shape[1] % 2 == 0):
        return silu_and_mul(gate_up)
    from pagedcore import _core

    rows, half = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, half, dtype=gate_up.dtype)  # [num_tokens, intermediate]
    if rows:
        _core.silu_mul_cpu(gate_up.data_ptr(), out.data_ptr(), rows, half, gate_up.stride(0), half,
                           _DTYPE_CODES[gate_up.dtype])
    return out
