"""Paged attention as a layer: write this step's K/V into the paged cache, attend over it.

AttentionMetadata is what the model runner builds once per step and every layer reads. The
ops (pagedcore.ops.attention) do the work; this layer only arranges views and the output buffer.

Slot of the token at position p of a sequence (block_size B):
    slot = block_table[p // B] * B + p % B
    seq 0 block_table [7, 2, -1]:   positions 0..15 -> block 7, 16..31 -> block 2, -1 = padding
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from pagedcore.ops import attention as attention_ops


@dataclasses.dataclass
class AttentionMetadata:
    """One step's batch layout; sequences are the rows of block_tables, tokens packed by sequence."""

    slot_mapping: torch.Tensor  # int64 [num_tokens]; cache slot of each new token, -1 = padding (not written)
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks_per_seq]; physical block ids, padded with -1
    seq_lens: torch.Tensor  # int32 [num_seqs]; tokens in the cache after this step (cached + new)
    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]; sequence s owns query rows [qsl[s], qsl[s+1])
    max_query_len: int  # most new tokens of any sequence this step
    max_seq_len: int  # largest seq_lens entry
    # Tokens that belong to a sequence (query_start_loc[-1]). Rows past it are padding (e.g. up to a
    # CUDA-graph batch size): written nowhere (slot -1) and left out of attention. None: no padding.
    num_actual_tokens: int | None = None


class Attention(nn.Module):
    """Causal multi-head attention with grouped K/V heads over a paged cache."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_cache: torch.Tensor, value_cache: torch.Tensor,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        """query [num_tokens, num_heads, head_dim]; key, value [num_tokens, num_kv_heads, head_dim]
        (views of the fused qkv output: any strides, last one 1); key_cache, value_cache
        [num_blocks, num_kv_heads, block_size, head_dim]. Returns [num_tokens, num_heads * head_dim]."""
        attention_ops.reshape_and_cache(key, value, key_cache, value_cache, attn_metadata.slot_mapping)
        num_tokens = query.shape[0]
        out = torch.empty(num_tokens, self.num_heads, self.head_dim,  # [num_tokens, num_heads, head_dim]
                          dtype=query.dtype, device=query.device)
        num_actual = attn_metadata.num_actual_tokens
        if num_actual is not None and num_actual < num_tokens:
            out[num_actual:].zero_()  # padding rows: defined values, so no NaN/denormal slow paths later
            query, out_rows = query[:num_actual], out[:num_actual]
        else:
            out_rows = out
        attention_ops.paged_attention(out_rows, query, key_cache, value_cache, attn_metadata.block_tables,
                                      attn_metadata.seq_lens, attn_metadata.query_start_loc, self.scale,
                                      attn_metadata.max_query_len, attn_metadata.max_seq_len)
        return out.view(num_tokens, self.num_heads * self.head_dim)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}"
