"""How one dense linear weight is multiplied: bound to pagedcore's kernel for calls of few rows (KernelBinding; every
call for an x16 repack), or to the library GEMM the CPU's plan names for many rows (LibraryBinding: oneDNN with the
weight prepacked once, or torch). layers/linear.py's dense method holds one of each per layer; the tied LM head
(layers/embedding.py, which imports it through layers/linear.py: that module must load before linear_quant.py) a
KernelBinding."""

from __future__ import annotations

import torch

from pagedcore.ops import dense_repack, linear_dispatch
from pagedcore.ops import linear as linear_ops
from pagedcore.ops.onednn_linear import PrepackedWeight


class KernelBinding:
    """A weight bound to the linear kernel for calls of up to `max_rows` rows, rebuilt when the
    weight's memory or the activation dtype changes (model.to(), a reload into a new tensor).
    x16: the weight passed in is the layer's x16 repack (ops/dense_repack.py), whose kernel beats
    the library GEMMs at every row count measured, so it takes every call."""

    __slots__ = ("kernel", "max_rows", "silu_mul", "out_dtype", "x16")

    def __init__(self, weight: torch.Tensor, silu_mul: bool = False, out_dtype: torch.dtype | None = None,
                 x16: bool = False):
        self.kernel: linear_ops.LinearKernel | None = None
        self.x16 = x16
        self.max_rows = dense_repack.X16_MAX_ROWS if x16 else linear_ops.max_rows(weight.dtype)
        self.silu_mul = silu_mul
        self.out_dtype = out_dtype

    def takes(self, x: torch.Tensor) -> bool:
        """x [num_rows, in] is small enough (and on the CPU) for the kernel."""
        return 0 < x.shape[0] <= self.max_rows and x.dim() == 2 and x.is_cpu

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return self.bound(weight, bias, x.dtype)(x)

    def bound(self, weight: torch.Tensor, bias: torch.Tensor | None, x_dtype: torch.dtype) -> linear_ops.LinearKernel:
        """The kernel for x of x_dtype against weight as held now (built again if either changed)."""
        kernel = self.kernel
        if kernel is None or x_dtype is not kernel.x_dtype or not kernel.matches(weight):
            self.max_rows = dense_repack.X16_MAX_ROWS if self.x16 else linear_ops.max_rows(weight.dtype)
            kernel = self.kernel = linear_ops.LinearKernel(
                weight, bias, silu_mul=self.silu_mul, x_dtype=x_dtype, out_dtype=self.out_dtype, x16=self.x16)
        return kernel


class LibraryBinding:
    """The many-row GEMM of one dense layer: what the CPU's plan names (linear_dispatch.gemm_plan):
    oneDNN with the weight prepacked once (at load, when the last rows of the weight arrive; again
    only if the weight moves), or torch's F.linear (widened for bf16 where the plan says so)."""

    __slots__ = ("library", "packed")

    def __init__(self, weight: torch.Tensor):
        self.library = linear_dispatch.gemm_plan(weight.dtype).library
        self.packed: PrepackedWeight | None = None

    def prepack(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        """Reorders the weight for oneDNN now (no-op unless the plan runs onednn_packed)."""
        self.packed = None
        if self.library == "onednn_packed" and weight.is_cpu:
            self.packed = PrepackedWeight(weight, bias)

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.library == "onednn_packed" and x.dtype is weight.dtype and x.is_cpu and weight.is_cpu:
            packed = self.packed
            if packed is None or not packed.matches(weight):
                self.prepack(weight, bias)
                packed = self.packed
            return packed(x)  # [..., in] -> [..., out]
        if self.packed is not None and not x.is_cpu:
            self.packed = None  # the model moved to a GPU after load: free the host copy
        return linear_ops.torch_linear(x, weight, bias)
