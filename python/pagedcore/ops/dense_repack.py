"""The dense x16 layouts of cpp/kernels/linear.h (kDenseF32x16, kDenseBf16x16): a float weight
W [N, K] re-laid once at load so that one vector holds 16 output columns, as the quantized x16
formats do (docs/quant_kernels.md). The kernel (cpp/kernels/dense_x16_impl.h) then broadcasts x and
never folds an accumulator horizontally:

    f32x16   [N/16, K, 16]        packed[g, k, c]    = W[16 g + c, k]
    bf16x16  [N/16, K/2, 16, 2]   packed[g, p, c, j] = W[16 g + c, 2 p + j]

The same bytes as W, lossless both ways (unpack_x16). Shapes the layout cannot hold (N not a
multiple of 16, K odd for bf16) stay in the checkpoint layout: x16_problem() says why.
"""

from __future__ import annotations

import os

import torch

__all__ = ["DEFAULT_ON_ISAS", "X16_FORMATS", "X16_MAX_ROWS", "dense_repack_enabled", "pack_x16", "packed_shape", "unpack_x16", "x16_problem"]

X16_COLS = 16
# Weight dtype -> the x16 format name (the WeightFormat names F32X16, BF16X16 of the binding).
X16_FORMATS = {torch.float32: "f32x16", torch.bfloat16: "bf16x16"}


# Rows up to which a repacked layer (and a decoder stack of repacked layers) calls the x16 kernel:
# every step (it matched or beat oneDNN at 256-512 rows, docs/performance.md "Dense x16 layouts");
# the bound only keeps activation buffers sane, as the quantized stack's.
X16_MAX_ROWS = 1 << 16
# The GEMM_PLANS rows (ops/linear_dispatch.py gemm_isa) where repacking is on by default: measured
# there. AVX2 / AVX-512 without BF16 run the kernel too but were not measured; on AMX CPUs oneDNN
# uses the tiles, which this kernel does not.
DEFAULT_ON_ISAS = frozenset({"avx512_bf16"})


def dense_repack_enabled(dtype: torch.dtype) -> bool:
    """Whether dense layers of `dtype` repack at load: PAGEDCORE_DENSE_REPACK=1 turns it on, 0 off;
    unset, on where the CPU's GEMM_PLANS row is in DEFAULT_ON_ISAS."""
    env = os.environ.get("PAGEDCORE_DENSE_REPACK")
    if env not in (None, "0", "1"):
        raise ValueError(f"PAGEDCORE_DENSE_REPACK={env!r}; set 1 (repack dense weights at load) or 0 (keep them)")
    if dtype not in X16_FORMATS:
        return False
    if env is not None:
        return env == "1"
    from pagedcore.ops.linear_dispatch import gemm_isa
    return gemm_isa() in DEFAULT_ON_ISAS


def x16_problem(weight: torch.Tensor, silu_mul: bool = False) -> str:
    """"" if `weight` [N, K] (gate/up halves when silu_mul) can be repacked, else why not."""
    if weight.dtype not in X16_FORMATS:
        return f"dtype {weight.dtype} has no x16 layout"
    if weight.dim() != 2:
        return f"weight has shape {tuple(weight.shape)}, not [N, K]"
    N, K = weight.shape
    cols = N // 2 if silu_mul else N
    if N % X16_COLS or cols % X16_COLS or (silu_mul and N % 2):
        return f"N = {N}{' (gate/up halves)' if silu_mul else ''} is not a multiple of 16"
    if weight.dtype is torch.bfloat16 and K % 2:
        return f"K = {K} is odd (bf16x16 holds pairs along K)"
    return ""


def packed_shape(N: int, K: int, dtype: torch.dtype) -> tuple[int, ...]:
    if dtype is torch.bfloat16:
        return (N // X16_COLS, K // 2, X16_COLS, 2)
    return (N // X16_COLS, K, X16_COLS)


def pack_x16(weight: torch.Tensor) -> torch.Tensor:
    """W [N, K] -> a new contiguous tensor in the x16 layout of its dtype (see the top of this file)."""
    problem = x16_problem(weight)
    if problem:
        raise ValueError(f"cannot repack this weight into an x16 layout: {problem}; keep the checkpoint layout")
    N, K = weight.shape
    if weight.dtype is torch.bfloat16:
        return weight.reshape(N // X16_COLS, X16_COLS, K // 2, 2).permute(0, 2, 1, 3).contiguous()
    return weight.reshape(N // X16_COLS, X16_COLS, K).transpose(1, 2).contiguous()


def unpack_x16(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_x16: [N, K] in the checkpoint layout."""
    if packed.dtype is torch.bfloat16 and packed.dim() == 4:
        G, P = packed.shape[0], packed.shape[1]
        return packed.permute(0, 2, 1, 3).reshape(G * X16_COLS, 2 * P)
    if packed.dtype is torch.float32 and packed.dim() == 3:
        G, K = packed.shape[0], packed.shape[1]
        return packed.transpose(1, 2).reshape(G * X16_COLS, K)
    raise ValueError(f"not an x16 layout: shape {tuple(packed.shape)}, dtype {packed.dtype}")
