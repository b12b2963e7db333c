"""Linear layers whose weights always come from a checkpoint, and fused ones that stack several.

Parameters are allocated with torch.empty: a random init of weights that are overwritten at once
would cost a second pass over ~0.5 GB (the default model in fp32) for nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagedcore.layers.weights import CheckpointTensor, copy_weight


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)  # [..., in] -> [..., out]

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

    def load_shard(self, shard_id: str, param_name: str, loaded: CheckpointTensor, name: str) -> None:
        """Copies one checkpoint tensor (weight [rows, in] or bias [rows]) into its rows."""
        start, size = self.shard_rows[shard_id]
        param = self.weight if param_name == "weight" else self.bias
        if param is None:
            raise ValueError(f"the checkpoint has {name!r} but this layer was built without a bias; "
                             "check attention_bias in the config")
        copy_weight(param.data.narrow(0, start, size), loaded, name)  # rows: contiguous
