"""Linear layers on pagedcore's own CPU kernel (cpp/kernels/linear.h): y = x @ W.T (+ b), and the
SwiGLU of a fused gate/up projection as its epilogue; and the fused elementwise ops of a decoder
layer (cpp/kernels/norm.h): residual add + RMSNorm, rotary embedding.

Why: at a few rows (decode), torch's MKL GEMV streams fp32 weights at a third of the memory
bandwidth, and on CPUs without AVX512-BF16 torch's bf16 GEMM runs at ~25 GFLOP/s at any size; this
kernel streams the weights (checkpoint layout, no packing) at the bandwidth and widens bf16 to fp32
in registers. See bench/bench_linear.py for the figures and `max_rows` for when layers use it.

`linear()` checks everything and raises with the fix in the message. `LinearKernel` binds one
layer's weight once (at load) so a call checks only x: what the model layers use.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

try:
    from pagedcore import _core

    _HAS_KERNEL = hasattr(_core, "LinearHandle")
except ImportError:  # the extension is not built: layers fall back to torch
    _core = None
    _HAS_KERNEL = False

__all__ = ["LinearKernel", "available", "isa", "linear", "max_rows", "rms_norm", "rotary_embedding",
           "supported_isas"]

# dtype codes shared with cpp/kernels/kernel_types.h (DType).
_DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 1}
# LinearIsa codes of cpp/kernels/linear.h.
ISA_CODES = {"auto": -1, "generic": 0, "generic16": 1, "avx2": 2, "avx512": 3, "generic16_bf16dot": 4,
             "avx512_bf16dot": 5}
_EPILOGUE = {"none": 0, "silu_mul": 1}

# Rows up to which the layers call this kernel instead of torch, per weight dtype. Measured with
# bench/bench_linear.py on the 2-core AVX2 development machine (2026-11-29, 2 threads): for fp32
# weights the kernel beats MKL by 2-2.9x at 16 rows, 1.1-1.5x at 64, 0.9-1.13x at 256 (the K = 1536
# down projection first), about even at 2048; for bf16 weights torch's GEMM (no AVX512-BF16 here)
# runs at ~15-30 GFLOP/s at every size, the kernel at 100-136, MKL's fp32 GEMM at 136-150 from 512
# rows on: past _MAX_ROWS_BF16 rows, bf16 layers widen their weight to fp32 for the call and run
# MKL (torch_linear below; the widening costs ~3% of the GEMM at 512 rows). Where the CPU has
# AVX512-BF16 (oneDNN's bf16 GEMM is fast there) bf16 takes the fp32 threshold and torch's bf16
# GEMM. PAGEDCORE_LINEAR_MAX_ROWS=<n> overrides both; 0 turns the kernel off (torch everywhere).
_MAX_ROWS_FP32 = 128
_MAX_ROWS_BF16 = 256


def available() -> bool:
    """True when the extension has the linear kernel."""
    return _HAS_KERNEL


def isa() -> str:
    """The kernel variant this CPU runs: generic, avx2, avx512 or avx512_bf16dot."""
    return _core.linear_isa_name(_core.linear_auto_isa()) if _HAS_KERNEL else "none"


def supported_isas() -> list[str]:
    """Every variant this CPU can run (tests run them all; generic16* emulate the AVX-512 tilings)."""
    if not _HAS_KERNEL:
        return []
    return [name for name, code in ISA_CODES.items() if code >= 0 and _core.linear_isa_supported(code)]


def max_rows(weight_dtype: torch.dtype) -> int:
    """Largest number of rows (tokens) for which model layers call this kernel rather than torch."""
    if not _HAS_KERNEL:
        return 0
    env = os.environ.get("PAGEDCORE_LINEAR_MAX_ROWS")
    if env is not None:
        try:
            value = int(env)
        except ValueError:
            raise ValueError(f"PAGEDCORE_LINEAR_MAX_ROWS={env!r} is not an integer; set a row count "
                             "(0 = always torch)") from None
        return max(value, 0)
    if weight_dtype == torch.bfloat16 and isa() != "avx512_bf16dot":
        return _MAX_ROWS_BF16
    return _MAX_ROWS_FP32


@functools.lru_cache(maxsize=None)
def _slow_bf16_gemm() -> bool:
    """torch's bf16 GEMM has no fast path on this CPU (no AVX512-BF16 / AMX): widen instead."""
    if os.environ.get("PAGEDCORE_WIDEN_BF16_GEMM") in ("0", "1"):
        return os.environ["PAGEDCORE_WIDEN_BF16_GEMM"] == "1"
    return _HAS_KERNEL and isa() != "avx512_bf16dot"


def torch_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear for the calls the kernel does not take (many rows). A bf16 weight on a CPU whose
    bf16 GEMM is slow is widened to fp32 for this call and the product rounded back to bf16: the
    same arithmetic as torch's bf16 GEMM (fp32 products and sums, one rounding of the output, bias
    added before it), at MKL's fp32 rate. x [..., in] -> [..., out] of x's dtype."""
    if weight.dtype is torch.bfloat16 and x.dtype is torch.bfloat16 and x.is_cpu and _slow_bf16_gemm():
        wide_bias = bias.float() if bias is not None else None
        return F.linear(x.float(), weight.float(), wide_bias).to(torch.bfloat16)
    return F.linear(x, weight, bias)


def _dtype_code(t: torch.Tensor, name: str) -> int:
    code = _DTYPE_CODE.get(t.dtype)
    if code is None:
        raise TypeError(f"{name} has dtype {t.dtype}; the linear kernel takes torch.float32 or torch.bfloat16 "
                        f"(cast with {name}.to(torch.bfloat16))")
    return code


def _isa_code(name: str) -> int:
    code = ISA_CODES.get(name)
    if code is None:
        raise ValueError(f"unknown ISA {name!r}; use one of {', '.join(ISA_CODES)}")
    if not _core.linear_isa_supported(code):
        raise ValueError(f"this CPU (or build) cannot run the {name} linear kernel; supported: "
                         f"{', '.join(supported_isas())}")
    return code


def _require_kernel() -> None:
    if not _HAS_KERNEL:
        raise RuntimeError("pagedcore._core has no linear kernel; rebuild the extension (scripts/dev-build)")


class LinearKernel:
    """One layer's weight (and bias) bound to the kernel. Call with x [M, K] (2-D, last stride 1,
    dtype x_dtype, on the CPU); returns a new [M, N] tensor (silu_mul: [M, N // 2]) of out_dtype.

    The weight must stay where it is: the layer rebuilds this object if its parameter moves
    (`matches`)."""

    __slots__ = ("weight", "bias", "N", "K", "out_cols", "x_dtype", "out_dtype", "_handle", "weight_ptr")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, silu_mul: bool = False,
                 x_dtype: torch.dtype | None = None, out_dtype: torch.dtype | None = None, isa: str = "auto"):
        _require_kernel()
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
        w_code = _dtype_code(weight, "weight")
        if weight.device.type != "cpu":
            raise ValueError(f"weight is on {weight.device}; the linear kernel runs on the CPU")
        if weight.dim() != 2:
            raise ValueError(f"weight has shape {tuple(weight.shape)}; expected [out_features, in_features]")
        if not weight.is_contiguous():
            raise ValueError("weight must be contiguous (call weight.contiguous() once at load)")
        N, K = weight.shape
        if silu_mul and N % 2:
            raise ValueError(f"silu_mul needs an even number of weight rows (gate rows then up rows); got {N}")
        bias_code = w_code
        if bias is not None:
            if not isinstance(bias, torch.Tensor):
                raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
            bias_code = _dtype_code(bias, "bias")
            if bias.device.type != "cpu" or bias.shape != (N,) or not bias.is_contiguous():
                raise ValueError(f"bias must be a contiguous CPU tensor of shape ({N},); got "
                                 f"{tuple(bias.shape)} on {bias.device}")
        self.weight, self.bias = weight, bias
        self.N, self.K = N, K
        self.out_cols = N // 2 if silu_mul else N
        self.x_dtype = x_dtype or weight.dtype
        self.out_dtype = out_dtype or self.x_dtype
        for name, dtype in (("x_dtype", self.x_dtype), ("out_dtype", self.out_dtype)):
            if dtype not in _DTYPE_CODE:
                raise TypeError(f"{name} {dtype} is not supported; use torch.float32 or torch.bfloat16")
        self.weight_ptr = weight.data_ptr()
        self._handle = _core.LinearHandle(
            self.weight_ptr, bias.data_ptr() if bias is not None else 0, N, K, _DTYPE_CODE[self.x_dtype],
            w_code, bias_code, _DTYPE_CODE[self.out_dtype], _EPILOGUE["silu_mul" if silu_mul else "none"],
            _isa_code(isa))

    def matches(self, weight: torch.Tensor) -> bool:
        """Still bound to this weight's memory (False after e.g. module.to() replaced it)."""
        return weight.data_ptr() == self.weight_ptr

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # Fast path: each property read once; anything unusual goes to the detailed checks.
        try:
            shape = x.shape
            ok = (x.dtype is self.x_dtype and len(shape) == 2 and shape[1] == self.K and x.is_cpu
                  and (x.stride(1) == 1 or self.K <= 1))
        except AttributeError:
            ok = False
        if not ok:
            self._explain(x)
        M = shape[0]
        out = torch.empty(M, self.out_cols, dtype=self.out_dtype)
        self._handle(out.data_ptr(), x.data_ptr(), M, x.stride(0), self.out_cols)
        return out

    def _explain(self, x) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.device.type != "cpu":
            raise ValueError(f"x is on {x.device}; the linear kernel runs on the CPU")
        if x.dtype != self.x_dtype:
            raise TypeError(f"x has dtype {x.dtype}; this layer's kernel takes {self.x_dtype} "
                            f"(x.to({self.x_dtype}))")
        if x.dim() != 2 or x.shape[1] != self.K:
            raise ValueError(f"x has shape {tuple(x.shape)}; expected [num_rows, {self.K}] (flatten leading dims "
                             f"with x.reshape(-1, {self.K}))")
        raise ValueError(f"x must have a unit stride in its last dim (strides {x.stride()}); call x.contiguous()")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, silu_mul: bool = False,
           out_dtype: torch.dtype | None = None, isa: str = "auto") -> torch.Tensor:
    """torch.nn.functional.linear on the kernel: x [..., K] -> [..., N] (silu_mul: silu(gate) * up,
    [..., N // 2], weight rows [0, N/2) gate and [N/2, N) up). x fp32 or bf16 with any leading dims
    whose rows can be addressed with one stride; weight [N, K] contiguous; out_dtype defaults to x's."""
    _require_kernel()
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    _dtype_code(x, "x")
    if x.dim() < 1:
        raise ValueError("x must have at least one dim [..., in_features]")
    kernel = LinearKernel(weight, bias, silu_mul=silu_mul, x_dtype=x.dtype, out_dtype=out_dtype, isa=isa)
    if x.shape[-1] != kernel.K:
        raise ValueError(f"x has {x.shape[-1]} input features (shape {tuple(x.shape)}) but weight has "
                         f"{kernel.K} (shape {tuple(weight.shape)})")
    lead = x.shape[:-1]
    try:
        rows = x.view(-1, kernel.K) if x.dim() != 2 else x
    except RuntimeError:
        raise ValueError(f"x's leading dims cannot be flattened without a copy (strides {x.stride()}); "
                         "call x.contiguous()") from None
    return kernel(rows).view(*lead, kernel.out_cols)


def _explain_rows(t, name: str, dtype: torch.dtype, n: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} is on {t.device}; these kernels run on the CPU")
    _dtype_code(t, name)
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
    _require_kernel()
    try:
        rows, n = x.shape
        dtype = x.dtype
        ok = (x.is_cpu and dtype in _DTYPE_CODE and (n <= 1 or x.stride(1) == 1) and weight.dtype is dtype
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
                       0 if residual is None else residual.stride(0), eps, _DTYPE_CODE[dtype],
                       -1 if isa == "auto" else _isa_code(isa))
    return out


def rotary_embedding(x: torch.Tensor, cos_sin: torch.Tensor, *, isa: str = "auto") -> None:
    """Rotates x [num_tokens, num_heads, head_dim] in place (rotate-half convention, HF's products
    and sums term for term): x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin. cos_sin [num_tokens,
    head_dim] holds [cos | sin] of each token's position (last stride 1). One dtype, fp32 or bf16;
    x may be a strided view (q and k of a fused qkv output) with a unit last stride."""
    _require_kernel()
    try:
        T, H, D = x.shape
        ok = (x.is_cpu and x.dtype in _DTYPE_CODE and x.stride(2) == 1 and cos_sin.dtype is x.dtype
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
                               cos_sin.stride(0), _DTYPE_CODE[x.dtype], -1 if isa == "auto" else _isa_code(isa))
