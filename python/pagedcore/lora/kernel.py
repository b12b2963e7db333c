"""The multi-LoRA op: checks the tensors, then one call of the C++ kernel (cpp/kernels/lora_kernel.h).

y[t] += scaling * B_a A_a x[t] for each listed token t of adapter slot a, every adapter of the step
in one call; rows not listed (base-model tokens) are left alone.
"""

from __future__ import annotations

import torch

from pagedcore import _core
from pagedcore.ops.dtypes import CPU_DTYPE_CODES


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(f"lora_shrink_expand: {msg}")


def lora_shrink_expand(x: torch.Tensor, y: torch.Tensor, a_t: torch.Tensor, b_t: torch.Tensor,
                       ranks: torch.Tensor, slice_starts: torch.Tensor, token_indices: torch.Tensor,
                       segment_slots: torch.Tensor, segment_starts: torch.Tensor) -> torch.Tensor:
    """Adds the low-rank terms into y in place and returns it.

    x [num_tokens, in], y [num_tokens, out] (fp32 or bf16, same dtype, rows contiguous);
    a_t fp32 [num_slots, in, num_slices * max_rank]; b_t fp32 [num_slots, num_slices * max_rank, out]
    (scaling folded in); ranks int32 [num_slots, num_slices]; slice_starts int32 [num_slices + 1];
    token_indices int32 [num_lora_tokens] grouped by slot; segment_slots int32 [num_segments];
    segment_starts int32 [num_segments + 1]."""
    _need(x.dim() == 2 and y.dim() == 2 and x.shape[0] == y.shape[0], f"x {tuple(x.shape)} and y {tuple(y.shape)} "
          "must be [num_tokens, in] and [num_tokens, out]")
    _need(x.dtype == y.dtype and x.dtype in (torch.float32, torch.bfloat16), f"x and y must share fp32 or bf16, "
          f"got {x.dtype} and {y.dtype}")
    _need(x.is_cpu and y.is_cpu, "x and y must be CPU tensors")
    _need(x.stride(1) == 1 and y.stride(1) == 1, "x and y rows must be contiguous")
    _need(a_t.dim() == 3 and b_t.dim() == 3 and a_t.dtype == b_t.dtype == torch.float32
          and a_t.is_contiguous() and b_t.is_contiguous(), "a_t and b_t must be contiguous fp32 stacks")
    num_slots, in_features, sr = a_t.shape
    num_slices = slice_starts.numel() - 1
    _need(num_slices >= 1 and sr % num_slices == 0, f"a_t's last dim {sr} is not num_slices ({num_slices}) * max_rank")
    _need(in_features == x.shape[1], f"a_t is for {in_features} input features, x has {x.shape[1]}")
    _need(tuple(b_t.shape) == (num_slots, sr, y.shape[1]), f"b_t {tuple(b_t.shape)} must be "
          f"[{num_slots}, {sr}, {y.shape[1]}]")
    _need(tuple(ranks.shape) == (num_slots, num_slices),
          f"ranks {tuple(ranks.shape)} must be [{num_slots}, {num_slices}]")
    for name, t in (("ranks", ranks), ("slice_starts", slice_starts), ("token_indices", token_indices),
                    ("segment_slots", segment_slots), ("segment_starts", segment_starts)):
        _need(t.dtype == torch.int32 and t.is_contiguous() and t.is_cpu,
              f"{name} must be a contiguous int32 CPU tensor")
    num_segments = segment_slots.numel()
    _need(segment_starts.numel() == num_segments + 1, "segment_starts must have num_segments + 1 entries")
    _need(int(segment_starts[-1]) == token_indices.numel(), "segment_starts must end at len(token_indices)")
    if num_segments == 0 or x.shape[0] == 0:
        return y
    _core.lora_shrink_expand_cpu(
        x.data_ptr(), y.data_ptr(), a_t.data_ptr(), b_t.data_ptr(), ranks.data_ptr(), slice_starts.data_ptr(),
        token_indices.data_ptr(), segment_slots.data_ptr(), segment_starts.data_ptr(), x.shape[0], in_features,
        y.shape[1], x.stride(0), y.stride(0), num_slots, num_slices, sr // num_slices, num_segments,
        CPU_DTYPE_CODES[x.dtype])
    return y
