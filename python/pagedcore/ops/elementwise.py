"""The fused elementwise ops of a decoder layer on pagedcore's CPU kernels (cpp/kernels/norm.h):
residual add + RMSNorm in one pass, and the rotary embedding of q and k in place. Both round as the
torch op sequence they replace (HF Llama's), so outputs match it bit for bit."""

from __future__ import annotations

import torch

from pagedcore import _core
from pagedcore.ops.dtypes import CPU_DTYPE_CODES, dtype_code
from pagedcore.ops.linear_isa import isa_code

__all__ = ["rms_norm", "rotary_embedding"]


def _explain_rows(t, name: str, dtype: torch.dtype, n: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} is on {t.device}; these kernels run on the CPU")
    dtype_code(t, name, CPU_DTYPE_CODES, "these kernels")
    if t.dtype != dtype:
        raise TypeError(f"{name} has dtype {t.dtype} but the others have {dtype}; use one dtype")
    if t.dim() != 2 or t.shape[1] != n:
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected [num_rows, {n}] (view it as 2-D)")
    if n > 1 and t.stride(1) != 1:
        raise ValueError(f"{name} must have a unit stride in its last dim (strides {t.stride()}); call .contiguous()")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None, *,
             out: torch.Tensor | None = None, isa: str = "auto") -> torch.Tensor:
    """RMSNorm of the rows of x [num_rows, n]: weight * x / sqrt(mean(x^2) + eps), in fp32, rounded as
    torch's op sequence (HF Llama: normalise in fp32, cast to the dtype, times weight). With residual
    [num_rows, n]: residual += x first (in place, rounded to the dtype) and residual is normalised.
    Writes out (a new tensor unless given; out may be x). All tensors one dtype, fp32 or bf16."""
    try:
        rows, n = x.shape
        dtype = x.dtype
        ok = (x.is_cpu and dtype in CPU_DTYPE_CODES and (n <= 1 or x.stride(1) == 1) and weight.dtype is dtype
              and weight.shape == (n,) and weight.is_contiguous() and weight.is_cpu)
        if ok and residual is not None:
            ok = (residual.dtype is dtype and residual.shape == x.shape and residual.is_cpu
                  and (n <= 1 or residual.stride(1) == 1))
        if ok and out is not None:
            ok = out.dtype is dtype and out.shape == x.shape and out.is_cpu and (n <= 1 or out.stride(1) == 1)
    except (AttributeError, ValueError, TypeError):
        ok = False
    if not ok:
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            raise ValueError(f"x must be a 2-D tensor [num_rows, n]; got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        n = x.shape[1]
        _explain_rows(x, "x", x.dtype, n)
        if not isinstance(weight, torch.Tensor) or weight.shape != (n,) or not weight.is_contiguous():
            raise ValueError(f"weight must be a contiguous tensor of shape ({n},)")
        _explain_rows(weight.view(1, n), "weight", x.dtype, n)
        for name, t in (("residual", residual), ("out", out)):
            if t is not None:
                _explain_rows(t, name, x.dtype, n)
                if t.shape != x.shape:
                    raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {tuple(x.shape)} like x")
        raise ValueError("rms_norm: unsupported arguments")  # not reached
    if out is None:
        out = torch.empty(rows, n, dtype=dtype)
    _core.rms_norm_cpu(out.data_ptr(), 0 if residual is None else residual.data_ptr(), x.data_ptr(),
                       weight.data_ptr(), rows, n, x.stride(0), out.stride(0),
                       0 if residual is None else residual.stride(0), eps, CPU_DTYPE_CODES[dtype],
                       -1 if isa == "auto" else isa_code(isa))
    return out


def rotary_embedding(x: torch.Tensor, cos_sin: torch.Tensor, *, isa: str = "auto") -> None:
    """Rotates x [num_tokens, num_heads, head_dim] in place (rotate-half convention, HF's products
    and sums term for term): x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin. cos_sin [num_tokens,
    head_dim] holds [cos | sin] of each token's position (last stride 1). One dtype, fp32 or bf16;
    x may be a strided view (q and k of a fused qkv output) with a unit last stride."""
    try:
        T, H, D = x.shape
        ok = (x.is_cpu and x.dtype in CPU_DTYPE_CODES and x.stride(2) == 1 and cos_sin.dtype is x.dtype
              and cos_sin.shape == (T, D) and cos_sin.stride(1) == 1 and cos_sin.is_cpu)
    except (AttributeError, ValueError, TypeError):
        ok = False
    if not ok:
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise ValueError("x must be a 3-D tensor [num_tokens, num_heads, head_dim]")
        T, H, D = x.shape
        _explain_rows(x.select(1, 0) if H else x.new_empty(T, D), "x (each head)", x.dtype, D)
        if not isinstance(cos_sin, torch.Tensor) or cos_sin.shape != (T, D):
            raise ValueError(f"cos_sin must have shape ({T}, {D}) = [num_tokens, head_dim]; got "
                             f"{tuple(cos_sin.shape) if isinstance(cos_sin, torch.Tensor) else type(cos_sin).__name__}")
        _explain_rows(cos_sin, "cos_sin", x.dtype, D)
        raise ValueError("rotary_embedding: unsupported arguments")  # not reached
    _core.rotary_embedding_cpu(x.data_ptr(), cos_sin.data_ptr(), T, H, D, x.stride(0), x.stride(1),
                               cos_sin.stride(0), CPU_DTYPE_CODES[x.dtype], -1 if isa == "auto" else isa_code(isa))
