"""Naive torch versions of the four paged KV-cache ops: the test oracle for pagedcore.ops.attention
and pagedcore.ops.attention_cuda (tests/kernels, tests/gpu) and the baseline of bench/bench_attention.py.
Never run by the engine.

Written for obviousness, not speed: K/V are gathered through the block table one sequence at a
time, the causal mask is explicit and the softmax runs in fp32. No argument checking beyond what
torch itself does; the ops check.
"""

from __future__ import annotations

import torch

from pagedcore._core import NULL_BLOCK, PAD_SLOT


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    """Writes key[i]/value[i] ([num_kv_heads, head_size]) at slot_mapping[i], skipping PAD_SLOT.

    A slot s lives at key_cache[s // block_size, :, s % block_size, :].
    """
    block_size = key_cache.shape[2]
    for i, slot in enumerate(slot_mapping.tolist()):
        if slot == PAD_SLOT:
            continue
        block, offset = divmod(slot, block_size)
        # .to() rounds fp32 -> bf16 to nearest even, as the kernel must.
        key_cache[block, :, offset, :] = key[i].to(key_cache.dtype)
        value_cache[block, :, offset, :] = value[i].to(value_cache.dtype)


def gather_kv(cache, block_table_row, seq_len):
    """One sequence's cache rows, contiguous: [seq_len, num_kv_heads, head_size] in fp32."""
    block_size = cache.shape[2]
    num_blocks = (seq_len + block_size - 1) // block_size
    block_ids = block_table_row[:num_blocks].long()
    assert bool((block_ids != NULL_BLOCK).all()), "block table has padding inside the sequence"
    blocks = cache[block_ids]  # [num_blocks, num_kv_heads, block_size, head_size]
    rows = blocks.permute(0, 2, 1, 3).reshape(num_blocks * block_size, cache.shape[1], cache.shape[3])
    return rows[:seq_len].float()


def paged_attention(out, query, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
                    scale, max_query_len=None, max_seq_len=None) -> None:
    """Causal attention of each sequence's query rows over its cached K/V; writes `out` in place."""
    num_heads = query.shape[1]
    num_kv_heads = key_cache.shape[1]
    group = num_heads // num_kv_heads
    qsl = query_start_loc.tolist()
    for s, seq_len in enumerate(seq_lens.tolist()):
        start, end = qsl[s], qsl[s + 1]
        q_len = end - start
        if q_len == 0:
            continue
        k = gather_kv(key_cache, block_tables[s], seq_len)  # [seq_len, num_kv_heads, head_size]
        v = gather_kv(value_cache, block_tables[s], seq_len)
        k = k.repeat_interleave(group, dim=1)  # [seq_len, num_heads, head_size]
        v = v.repeat_interleave(group, dim=1)
        q = query[start:end].float()  # [q_len, num_heads, head_size]
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale  # [num_heads, q_len, seq_len]
        positions = seq_len - q_len + torch.arange(q_len)  # absolute position of each query row
        allowed = torch.arange(seq_len)[None, :] <= positions[:, None]  # [q_len, seq_len]
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[start:end] = torch.einsum("hqk,khd->qhd", probs, v).to(out.dtype)


def copy_blocks(kv_cache, block_mapping) -> None:
    """For each row (src, dst): every layer's K and V block src is copied to block dst, in order."""
    for src, dst in block_mapping.tolist():
        kv_cache[:, :, dst] = kv_cache[:, :, src]


def swap_blocks(src_kv_cache, dst_kv_cache, block_mapping) -> None:
    """For each row (src, dst): src_kv_cache[:, :, src] -> dst_kv_cache[:, :, dst]."""
    for src, dst in block_mapping.tolist():
        dst_kv_cache[:, :, dst] = src_kv_cache[:, :, src].to(dst_kv_cache.device)
