"""The dtype codes the kernels take, defined once for every op: they are the DType enums of
cpp/kernels/kernel_types.h (CPU) and cuda/cuda_types.h (GPU), so a change there changes these."""

from __future__ import annotations

import torch

# cpp/kernels/kernel_types.h DType: the CPU kernels and the C++ decoder stack.
CPU_DTYPE_CODES: dict[torch.dtype, int] = {torch.float32: 0, torch.bfloat16: 1}
# ...and what a CPU KV cache may hold besides: the fp8 formats of --kv-cache-dtype fp8_e4m3 / fp8_e5m2
# (cpp/kernels/fp8.h; the CUDA kernels take none).
CPU_CACHE_DTYPE_CODES: dict[torch.dtype, int] = {**CPU_DTYPE_CODES, torch.float8_e4m3fn: 3, torch.float8_e5m2: 4}
# cuda/cuda_types.h DType: the CPU codes plus fp16, which only the GPU kernels take.
CUDA_DTYPE_CODES: dict[torch.dtype, int] = {**CPU_DTYPE_CODES, torch.float16: 2}


def dtype_code(t: torch.Tensor, name: str, codes: dict[torch.dtype, int], kernels: str) -> int:
    """The code of t's dtype in `codes`; raises TypeError naming the dtypes `kernels` (e.g. "the CPU
    kernels") take."""
    code = codes.get(t.dtype)
    if code is None:
        allowed = " or ".join(str(d) for d in codes)
        raise TypeError(f"{name} has dtype {t.dtype}; {kernels} take {allowed} (cast with {name}.to(torch.bfloat16))")
    return code
