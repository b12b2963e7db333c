"""The linear op on pagedcore's own CPU kernel (cpp/kernels/linear.h): y = x @ W.T (+ b), and the
SwiGLU of a fused gate/up projection as its epilogue; and torch's GEMM for the calls it does not take.

Why: at a few rows (decode), torch's MKL GEMV streams fp32 weights at a third of the memory
bandwidth, and on CPUs without AVX512-BF16 torch's bf16 GEMM runs at ~25 GFLOP/s at any size; this
kernel streams the weights (checkpoint layout, no packing) at the bandwidth and widens bf16 to fp32
in registers. Past `max_rows` rows torch's GEMM (MKL) is as fast or faster, so the layers call
`torch_linear` there: that is the design, not a fallback. See bench/bench_linear.py for the figures.

`linear()` checks everything and raises with the fix in the message. `LinearKernel` binds one
layer's weight once (at load) so a call checks only x: what the model layers use.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagedcore import _core
from pagedcore.ops.dtypes import CPU_DTYPE_CODES, dtype_code
from pagedcore.ops.linear_dispatch import gemm_plan
from pagedcore.ops.linear_isa import isa_code

__all__ = ["LinearKernel", "linear", "max_rows", "torch_linear"]

_EPILOGUE = {"none": 0, "silu_mul": 1}
# The dense weight format of each weight dtype (WeightFormat of cpp/kernels/linear.h). fp16 is a weight dtype
# only (a GPTQ / AWQ checkpoint's unquantized head or table, held as stored): x is fp32 (or bf16) against it.
_WEIGHT_FORMATS = {torch.float32: _core.WeightFormat.DENSE_F32, torch.bfloat16: _core.WeightFormat.DENSE_BF16,
                   torch.float16: _core.WeightFormat.DENSE_F16}
# The repacked x16 layout of each weight dtype (ops/dense_repack.py).
_X16_WEIGHT_FORMATS = {torch.float32: _core.WeightFormat.F32X16, torch.bfloat16: _core.WeightFormat.BF16X16,
                       torch.float16: _core.WeightFormat.F16X16}

# Rows up to which the layers call this kernel, and what runs above them, come from the per-ISA
# table of pagedcore.ops.linear_dispatch (GEMM_PLANS, measured with bench/bench_linear.py
# --library): on the AVX2 machine 128 rows for fp32 and 256 for bf16 (whose torch GEMM is slow
# there: widened to fp32 above), on AVX512-BF16 (Zen 5) fewer, with oneDNN's prepacked GEMM
# above. PAGEDCORE_LINEAR_MAX_ROWS=<n> overrides the rows; 0 turns the kernel off.


def max_rows(weight_dtype: torch.dtype) -> int:
    """Largest number of rows (tokens) for which model layers call this kernel rather than a library."""
    return gemm_plan(weight_dtype).kernel_max_rows


def _slow_bf16_gemm() -> bool:
    """torch's bf16 GEMM has no fast path on this CPU (no AVX512-BF16 / AMX): widen instead."""
    return gemm_plan(torch.bfloat16).library == "widen"


_slow_bf16_gemm.cache_clear = lambda: None  # the plan reads the environment at each call


def torch_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear for the calls the kernel does not take (many rows). A bf16 weight on a CPU whose
    bf16 GEMM is slow is widened to fp32 for this call and the product rounded back to bf16: the
    same arithmetic as torch's bf16 GEMM (fp32 products and sums, one rounding of the output, bias
    added before it), at MKL's fp32 rate. A weight of another dtype than x is widened to x's for the
    call. x [..., in] -> [..., out] of x's dtype."""
    if weight.dtype is torch.bfloat16 and x.dtype is torch.bfloat16 and x.is_cpu and _slow_bf16_gemm():
        wide_bias = bias.float() if bias is not None else None
        return F.linear(x.float(), weight.float(), wide_bias).to(torch.bfloat16)
    if weight.dtype is not x.dtype:  # bf16 weights under fp32 activations (layers/linear.py): widened, exact
        return F.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))
    return F.linear(x, weight, bias)


def _dtype_code(t: torch.Tensor, name: str) -> int:
    return dtype_code(t, name, CPU_DTYPE_CODES, "the linear kernels")


def explain_bad_x(x, x_dtype: torch.dtype, K: int, kernel: str) -> None:
    """Raises the error that says what is wrong with x for a kernel taking [num_rows, K] rows of
    x_dtype with a unit last stride (called once the fast check has failed)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.device.type != "cpu":
        raise ValueError(f"x is on {x.device}; {kernel} runs on the CPU")
    if x.dtype != x_dtype:
        raise TypeError(f"x has dtype {x.dtype}; this layer's kernel takes {x_dtype} (x.to({x_dtype}))")
    if x.dim() != 2 or x.shape[1] != K:
        raise ValueError(f"x has shape {tuple(x.shape)}; expected [num_rows, {K}] (flatten leading dims "
                         f"with x.reshape(-1, {K}))")
    raise ValueError(f"x must have a unit stride in its last dim (strides {x.stride()}); call x.contiguous()")


class LinearKernel:
    """One layer's weight (and bias) bound to the kernel. Call with x [M, K] (2-D, last stride 1,
    dtype x_dtype, on the CPU); returns a new [M, N] tensor (silu_mul: [M, N // 2]) of out_dtype.

    The weight must stay where it is: the layer rebuilds this object if its parameter moves
    (`matches`). x16=True: the weight is in its dtype's x16 layout (ops/dense_repack.py pack_x16:
    f32 / fp16 [N/16, K, 16], bf16 [N/16, K/2, 16, 2]), run by the outer-product kernel. An fp16
    weight takes fp32 x by default (fp16 is no activation dtype here); the kernel widens it exactly."""

    __slots__ = ("weight", "bias", "N", "K", "out_cols", "x_dtype", "out_dtype", "_handle", "weight_ptr")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, silu_mul: bool = False,
                 x_dtype: torch.dtype | None = None, out_dtype: torch.dtype | None = None, isa: str = "auto",
                 x16: bool = False):
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
        if weight.dtype not in _WEIGHT_FORMATS:
            raise TypeError(f"weight has dtype {weight.dtype}; the linear kernels take float32, bfloat16 or "
                            "float16 weights")
        if weight.device.type != "cpu":
            raise ValueError(f"weight is on {weight.device}; the linear kernel runs on the CPU")
        if x16:
            from pagedcore.ops.dense_repack import X16_COLS
            want = 4 if weight.dtype is torch.bfloat16 else 3
            if weight.dim() != want or weight.shape[2] != X16_COLS or (want == 4 and weight.shape[3] != 2):
                raise ValueError(f"weight has shape {tuple(weight.shape)}; an x16 layout of {weight.dtype} is "
                                 f"{'[N/16, K/2, 16, 2]' if want == 4 else '[N/16, K, 16]'} (dense_repack.pack_x16)")
            N, K = weight.shape[0] * X16_COLS, weight.shape[1] * (2 if want == 4 else 1)
        elif weight.dim() != 2:
            raise ValueError(f"weight has shape {tuple(weight.shape)}; expected [out_features, in_features]")
        else:
            N, K = weight.shape
        if not weight.is_contiguous():
            raise ValueError("weight must be contiguous (call weight.contiguous() once at load)")
        if silu_mul and N % 2:
            raise ValueError(f"silu_mul needs an even number of weight rows (gate rows then up rows); got {N}")
        bias_code = CPU_DTYPE_CODES.get(weight.dtype, 0)  # (no bias: any valid code)
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
        self.x_dtype = x_dtype or (torch.float32 if weight.dtype is torch.float16 else weight.dtype)
        self.out_dtype = out_dtype or self.x_dtype
        for name, dtype in (("x_dtype", self.x_dtype), ("out_dtype", self.out_dtype)):
            if dtype not in CPU_DTYPE_CODES:
                raise TypeError(f"{name} {dtype} is not supported; use torch.float32 or torch.bfloat16")
        self.weight_ptr = weight.data_ptr()
        self._handle = _core.LinearHandle(
            weight=self.weight_ptr, bias=bias.data_ptr() if bias is not None else 0, N=N, K=K,
            x_dtype=CPU_DTYPE_CODES[self.x_dtype],
            weight_format=(_X16_WEIGHT_FORMATS if x16 else _WEIGHT_FORMATS)[weight.dtype],
            bias_dtype=bias_code, out_dtype=CPU_DTYPE_CODES[self.out_dtype],
            epilogue=_EPILOGUE["silu_mul" if silu_mul else "none"], isa=isa_code(isa))

    def matches(self, weight: torch.Tensor) -> bool:
        """Still bound to this weight's memory (False after e.g. module.to() replaced it)."""
        return weight.data_ptr() == self.weight_ptr

    @property
    def handle(self):
        """The bound _core.LinearHandle (for C++ callers such as _core.GreedyDecoder)."""
        return self._handle

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
        explain_bad_x(x, self.x_dtype, self.K, "the linear kernel")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, silu_mul: bool = False,
           out_dtype: torch.dtype | None = None, isa: str = "auto", x16: bool = False) -> torch.Tensor:
    """torch.nn.functional.linear on the kernel: x [..., K] -> [..., N] (silu_mul: silu(gate) * up,
    [..., N // 2], weight rows [0, N/2) gate and [N/2, N) up). x fp32 or bf16 with any leading dims
    whose rows can be addressed with one stride; weight [N, K] contiguous; out_dtype defaults to x's."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    _dtype_code(x, "x")
    if x.dim() < 1:
        raise ValueError("x must have at least one dim [..., in_features]")
    kernel = LinearKernel(weight, bias, silu_mul=silu_mul, x_dtype=x.dtype, out_dtype=out_dtype, isa=isa, x16=x16)
    if x.shape[-1] != kernel.K:
        raise ValueError(f"x has {x.shape[-1]} input features (shape {tuple(x.shape)}) but weight has "
                         f"{kernel.K} (shape {tuple(weight.shape)}{', x16 layout' if x16 else ''})")
    lead = x.shape[:-1]
    try:
        rows = x.view(-1, kernel.K) if x.dim() != 2 else x
    except RuntimeError:
        raise ValueError(f"x's leading dims cannot be flattened without a copy (strides {x.stride()}); "
                         "call x.contiguous()") from None
    return kernel(rows).view(*lead, kernel.out_cols)
