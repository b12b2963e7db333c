"""The library GEMM for many-row calls: oneDNN (the copy inside torch, through its mkldnn ops) with
the weight reordered ONCE, at load, into the blocked layout oneDNN's kernels read (AVX512-BF16's
vdpbf16ps pairs, AMX tiles where the CPU has them), instead of torch's F.linear re-laying out (or,
for bf16 on CPUs without bf16 instructions, widening) the weight on every call.

    packed = PrepackedWeight(weight, bias)      # at load: weight [N, K] fp32/bf16, bias [N] or None
    y = packed(x)                                # x [..., K] of the weight's dtype -> [..., N]

torch exposes the pair as torch.ops.mkldnn._reorder_linear_weight (weight -> an opaque mkldnn
tensor) and torch.ops.mkldnn._linear_pointwise (x, packed, bias, "none", [], ""), the ops Inductor's
CPU freezing pass emits; their arithmetic is oneDNN's (fp32 accumulation, one rounding of the
output for bf16: the same as F.linear's bf16 GEMM). Where these ops are missing (a torch built
without mkldnn, or one that renamed them) `available()` is False and the layers keep F.linear.

Cost: the packed copy is a second copy of the weight (the checkpoint-layout one stays for the
few-row kernel and the C++ decoder stack, which read it directly). Which calls use it is decided
by pagedcore.ops.linear_dispatch (measured per ISA), not here.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["PrepackedWeight", "available", "unavailable_reason"]


@functools.lru_cache(maxsize=None)
def unavailable_reason(dtype: torch.dtype | None = None) -> str:
    """Why the prepacked path cannot run here for weights of `dtype` (fp32 or bf16; None: for both),
    "" when it can. Per dtype because oneDNN refuses bf16 on CPUs without AVX-512 (BW, VL, DQ) or
    AVX-NE-CONVERT (an AVX2-only EPYC: seen on an emulated one, `make test-emulated`) while fp32 runs."""
    if not torch.backends.mkldnn.is_available():
        return "torch was built without mkldnn (oneDNN)"
    try:
        reorder = torch.ops.mkldnn._reorder_linear_weight
        run = torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError) as e:
        return f"torch {torch.__version__} lacks mkldnn::_reorder_linear_weight/_linear_pointwise ({e})"
    try:  # one tiny call of each: the ops can exist and still refuse a dtype at run time
        for probe in (torch.float32, torch.bfloat16) if dtype is None else (dtype,):
            w = torch.ones(8, 16, dtype=probe)  # [N, K]
            y = run(torch.ones(2, 16, dtype=probe), reorder(w, None), None, "none", [], "")
            if tuple(y.shape) != (2, 8) or float(y[0, 0]) != 16.0:
                return f"mkldnn linear gave a wrong result for {probe} ({y[0, 0]})"
    except RuntimeError as e:
        return f"mkldnn linear failed for {dtype or 'fp32 or bf16'}: {str(e).splitlines()[0]}"
    return ""


def available(dtype: torch.dtype | None = None) -> bool:
    """The prepacked path runs here for `dtype` (None: for fp32 and bf16 both)."""
    return unavailable_reason(dtype) == ""


class PrepackedWeight:
    """One layer's weight [N, K] (fp32 or bf16) reordered for oneDNN, and its bias [N] (or None).
    Call with x [..., K] of the weight's dtype on the CPU; returns [..., N] of that dtype."""

    __slots__ = ("packed", "bias", "N", "K", "dtype", "source_ptr")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        if weight.dim() != 2 or weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"PrepackedWeight takes a 2-D fp32/bf16 CPU weight; got {tuple(weight.shape)} "
                             f"{weight.dtype} on {weight.device}")
        reason = unavailable_reason(weight.dtype)
        if reason:
            raise RuntimeError(f"the oneDNN prepacked linear cannot run here: {reason}")
        self.N, self.K = weight.shape
        self.dtype = weight.dtype
        # batch_size None: one layout for every row count (the packed weight serves prefill chunks
        # and large decode batches alike; a per-M layout measured no better, see docs/performance.md).
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)  # opaque
        self.bias = None if bias is None else bias.detach().to(weight.dtype).contiguous()  # [N]
        self.source_ptr = weight.data_ptr()

    def matches(self, weight: torch.Tensor) -> bool:
        """Packed from this weight's memory (False after model.to() or a reload into new tensors).
        An in-place overwrite of the weight is not seen: re-create the layer's binding after one."""
        return weight.data_ptr() == self.source_ptr and weight.dtype is self.dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype is not self.dtype or x.shape[-1] != self.K or not x.is_cpu:
            raise ValueError(f"x {tuple(x.shape)} {x.dtype} on {x.device} does not fit this packed weight "
                             f"([{self.N}, {self.K}] {self.dtype}); cast x to {self.dtype}")
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")
