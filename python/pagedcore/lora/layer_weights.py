"""LoRALayerWeights: the adapter slots of one linear layer, and the call that adds their terms.

A Linear's `lora` hook (layers/linear.py) holds one of these; the layer's output y gets
y[t] += scaling * B_a A_a x[t] for each token t of this step that runs an adapter (slot a).
A fused layer (qkv, gate_up) is several output slices, each with its own A and B; the stacks
are laid out for the C++ kernel (cpp/kernels/lora_kernel.h draws them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from pagedcore import _core
from pagedcore.lora.kernel import lora_shrink_expand
from pagedcore.ops.dtypes import CPU_DTYPE_CODES as _DTYPE_CODES


@dataclass
class LoRABatch:
    """One step's token rows that run an adapter, grouped by slot (built by LoRAManager.prepare)."""

    token_indices: torch.Tensor   # int32 [num_lora_tokens] rows of the step's flat token batch
    segment_slots: torch.Tensor   # int32 [num_segments] the slot of each group
    segment_starts: torch.Tensor  # int32 [num_segments + 1] group bounds in token_indices


class LoRABatchRef:
    """The step's LoRABatch, shared by every layer's LoRALayerWeights (None: no adapter rows)."""

    __slots__ = ("batch",)

    def __init__(self):
        self.batch: LoRABatch | None = None


class LoRALayerWeights(nn.Module):
    def __init__(self, in_features: int, shard_rows: dict[str | None, tuple[int, int]], out_features: int,
                 num_slots: int, max_rank: int, batch_ref: LoRABatchRef):
        super().__init__()
        self.shard_ids = list(shard_rows)  # slice order = the fused layer's row order
        num_slices = self.num_slices = len(self.shard_ids)
        self.max_rank = max_rank
        self.batch_ref = batch_ref
        starts = [first for first, _ in shard_rows.values()] + [out_features]
        self.register_buffer("slice_starts", torch.tensor(starts, dtype=torch.int32), persistent=False)  # [S + 1]
        self.register_buffer("a_t", torch.zeros(num_slots, in_features, num_slices * max_rank),
                             persistent=False)  # [slots, in, S * R]
        self.register_buffer("b_t", torch.zeros(num_slots, num_slices * max_rank, out_features),
                             persistent=False)  # [slots, S * R, out], scaling folded in
        self.register_buffer("ranks", torch.zeros(num_slots, num_slices, dtype=torch.int32),
                             persistent=False)  # [slots, S]; 0: the slice is not adapted

    @property
    def active(self) -> bool:
        """Whether this step has rows that run an adapter."""
        return self.batch_ref.batch is not None

    @torch.no_grad()
    def set_slot(self, slot: int, shards: dict[str | None, tuple[torch.Tensor, torch.Tensor]] | None) -> None:
        """Puts one adapter's matrices of this layer in `slot` (shard id -> (A [r, in], scaled B
        [shard_out, r])); None or a missing shard leaves that slice unadapted."""
        R = self.max_rank
        self.ranks[slot].zero_()
        self.a_t[slot].zero_()
        self.b_t[slot].zero_()
        for s, shard in enumerate(self.shard_ids):
            pair = (shards or {}).get(shard)
            if pair is None:
                continue
            a, b = pair
            r = a.shape[0]
            c0, c1 = int(self.slice_starts[s]), int(self.slice_starts[s + 1])
            self.a_t[slot, :, s * R:s * R + r] = a.t()
            self.b_t[slot, s * R:s * R + r, c0:c1] = b.t()
            self.ranks[slot, s] = r

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """x [num_tokens, in], y [num_tokens, out] (the base output): y with this step's adapter terms added."""
        batch = self.batch_ref.batch
        if batch is None:
            return y
        if x.stride(-1) != 1:
            x = x.contiguous()
        a_t, b_t = self.a_t, self.b_t
        if (x.dim() == 2 and y.dim() == 2 and x.dtype is y.dtype and x.dtype in _DTYPE_CODES and y.stride(1) == 1
                and x.shape[0] == y.shape[0] and x.shape[1] == a_t.shape[1] and y.shape[1] == b_t.shape[2]
                and x.is_cpu and y.is_cpu):
            # The hot path (every adapted layer, every step): this layer's stacks were laid out and the
            # step's groups built by us (LoRAManager.prepare), so only x and y need checking; the C++
            # launcher still checks every index.
            _core.lora_shrink_expand_cpu(
                x.data_ptr(), y.data_ptr(), a_t.data_ptr(), b_t.data_ptr(), self.ranks.data_ptr(),
                self.slice_starts.data_ptr(), batch.token_indices.data_ptr(), batch.segment_slots.data_ptr(),
                batch.segment_starts.data_ptr(), x.shape[0], x.shape[1], y.shape[1], x.stride(0), y.stride(0),
                a_t.shape[0], self.num_slices, self.max_rank, batch.segment_slots.numel(), _DTYPE_CODES[x.dtype])
            return y
        return lora_shrink_expand(x, y, a_t, b_t, self.ranks, self.slice_starts, batch.token_indices,
                                  batch.segment_slots, batch.segment_starts)  # checks everything, names the fault

    def extra_repr(self) -> str:
        return f"slices={self.shard_ids}, slots={self.a_t.shape[0]}, max_rank={self.max_rank}"
