"""Linear layers whose weights always come from a checkpoint, and fused ones that stack several.

Parameters are allocated with torch.empty: a random init of weights that are overwritten at once
would cost a second pass over ~0.5 GB (the default model in fp32) for nothing.

Calls with few rows (decode) run pagedcore's own kernel (pagedcore.kernels_linear), which streams
the weights at the memory bandwidth where torch's GEMV reaches a third of it; larger calls keep
torch's GEMM (kernels_linear.max_rows says where the line is), with bf16 weights widened to fp32
for the call on CPUs without AVX512-BF16, where torch's bf16 GEMM is 5x slower than MKL's fp32 one
(kernels_linear.torch_linear).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagedcore import kernels_linear
from pagedcore.layers.weights import CheckpointTensor, copy_weight


class KernelBinding:
    """A weight bound to the linear kernel for calls of up to `max_rows` rows, rebuilt when the
    weight's memory or the activation dtype changes (model.to(), a reload into a new tensor)."""

    __slots__ = ("kernel", "max_rows", "silu_mul", "out_dtype")

    def __init__(self, weight: torch.Tensor, silu_mul: bool = False, out_dtype: torch.dtype | None = None):
        self.kernel: kernels_linear.LinearKernel | None = None
        self.max_rows = kernels_linear.max_rows(weight.dtype)
        self.silu_mul = silu_mul
        self.out_dtype = out_dtype

    def takes(self, x: torch.Tensor) -> bool:
        """x [num_rows, in] is small enough (and on the CPU) for the kernel."""
        return 0 < x.shape[0] <= self.max_rows and x.dim() == 2 and x.is_cpu

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        kernel = self.kernel
        if kernel is None or x.dtype is not kernel.x_dtype or not kernel.matches(weight):
            self.max_rows = kernels_linear.max_rows(weight.dtype)
            kernel = self.kernel = kernels_linear.LinearKernel(
                weight, bias, silu_mul=self.silu_mul, x_dtype=x.dtype, out_dtype=self.out_dtype)
        return kernel(x)


class Linear(nn.Module):
    """y = x @ W.T (+ b), for inference only."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype),  # [out, in]
                                   requires_grad=False)
        self.bias = (nn.Parameter(torch.empty(out_features, dtype=dtype), requires_grad=False)  # [out]
                     if bias else None)
        self._kernel = KernelBinding(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._kernel.takes(x):
            return self._kernel(x, self.weight, self.bias)  # [num_rows, in] -> [num_rows, out]
        return kernels_linear.torch_linear(x, self.weight, self.bias)  # [..., in] -> [..., out]

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, bias={self.bias is not None}"


class MergedLinear(Linear):
    """Several projections of the same input stacked along the output dim, so one GEMM does them all.

    The q/k/v projections become one `qkv_proj`, gate and up one `gate_up_proj`: one pass over the
    activations instead of three (two), and bigger GEMMs. Checkpoints keep them apart, so each
    part ("shard") is copied into its rows at load time:

        weight rows  [0, size_0)  [size_0, size_0 + size_1)  ...
        shard         shard_ids[0]  shard_ids[1]            ...
    """

    def __init__(self, in_features: int, shard_sizes: dict[str, int], bias: bool, dtype: torch.dtype):
        super().__init__(in_features, sum(shard_sizes.values()), bias, dtype)
        self.shard_rows: dict[str, tuple[int, int]] = {}  # shard id -> (first row, number of rows)
        start = 0
        for shard_id, size in shard_sizes.items():
            self.shard_rows[shard_id] = (start, size)
            start += size
        self._silu_mul_kernel = KernelBinding(self.weight, silu_mul=True)

    def forward_silu_mul(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up for a gate/up projection (two shards of equal size, gate first):
        [num_tokens, in] -> [num_tokens, out // 2]. Few rows: one kernel call, SwiGLU in its
        epilogue (no [num_tokens, out] intermediate); otherwise torch's GEMM, then silu * up."""
        if self._silu_mul_kernel.takes(x):
            return self._silu_mul_kernel(x, self.weight, self.bias)
        gate_up = kernels_linear.torch_linear(x, self.weight, self.bias)  # [num_tokens, out]
        half = gate_up.shape[-1] // 2
        return F.silu(gate_up[..., :half]).mul_(gate_up[..., half:])

    def load_shard(self, shard_id: str, param_name: str, loaded: CheckpointTensor, name: str) -> None:
        """Copies one checkpoint tensor (weight [rows, in] or bias [rows]) into its rows."""
        start, size = self.shard_rows[shard_id]
        param = self.weight if param_name == "weight" else self.bias
        if param is None:
            raise ValueError(f"the checkpoint has {name!r} but this layer was built without a bias; "
                             "check attention_bias in the config")
        copy_weight(param.data.narrow(0, start, size), loaded, name)  # rows: contiguous
