"""Shared builders for the kernel tests: random paged caches with shuffled block tables."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

import pagedcore._core as _core


def available_isas():
    """The kernel ISAs this CPU runs. generic16_bf16 emulates AVX512-BF16's pair dot products (the
    attention kernel's tiles over a bf16 cache) on any CPU; avx512_bf16 runs them natively."""
    isas = ["generic", "generic16", "generic16_bf16"]
    saved = _core.kernel_isa()
    for name in ("avx2", "avx512", "avx512_bf16"):
        if _core.set_kernel_isa(name):
            isas.append(name)
    _core.set_kernel_isa(saved)
    return isas


@pytest.fixture(params=available_isas())
def isa(request):
    saved = _core.kernel_isa()
    assert _core.set_kernel_isa(request.param)
    yield request.param
    _core.set_kernel_isa(saved)


@dataclass
class PagedBatch:
    """A mixed batch over one layer's cache; every slot no sequence owns holds NaN."""

    key_cache: torch.Tensor  # [num_blocks, num_kv_heads, block_size, head_size]
    value_cache: torch.Tensor
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks_per_seq], -1 padded
    seq_lens: torch.Tensor  # int32 [num_seqs]
    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]
    query: torch.Tensor  # [num_tokens, num_heads, head_size], a non-contiguous view
    num_heads: int
    scale: float


def make_batch(seqs, *, num_heads, num_kv_heads, head_size, block_size, cache_dtype=torch.float32,
               q_dtype=torch.float32, extra_blocks=7, extra_columns=2, seed=0) -> PagedBatch:
    """seqs: (context_len, q_len) per sequence; seq_len = context_len + q_len."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    blocks_per_seq = [-(-(c + q) // block_size) for c, q in seqs]
    num_blocks = sum(blocks_per_seq) + extra_blocks
    ids = list(range(num_blocks))
    rng.shuffle(ids)  # non-contiguous, out of order
    max_blocks = max(blocks_per_seq) + extra_columns
    block_tables = torch.full((len(seqs), max_blocks), -1, dtype=torch.int32)
    key_cache = torch.full((num_blocks, num_kv_heads, block_size, head_size), float("nan"), dtype=cache_dtype)
    value_cache = torch.full_like(key_cache, float("nan"))
    at = 0
    for s, ((c, q), nb) in enumerate(zip(seqs, blocks_per_seq)):
        block_tables[s, :nb] = torch.tensor(ids[at:at + nb], dtype=torch.int32)
        at += nb
        seq_len = c + q
        k = torch.randn(seq_len, num_kv_heads, head_size, generator=gen)
        v = torch.randn(seq_len, num_kv_heads, head_size, generator=gen)
        for p in range(seq_len):
            blk, off = block_tables[s, p // block_size].item(), p % block_size
            key_cache[blk, :, off] = k[p].to(cache_dtype)
            value_cache[blk, :, off] = v[p].to(cache_dtype)
    num_tokens = sum(q for _, q in seqs)
    # A slice of a wider buffer, as a fused qkv projection hands it over: strides (3*H*D, D, 1).
    fused = torch.randn(num_tokens, 3 * num_heads, head_size, generator=gen).to(q_dtype)
    query = fused[:, num_heads:2 * num_heads]
    qsl = [0]
    for _, q in seqs:
        qsl.append(qsl[-1] + q)
    return PagedBatch(key_cache, value_cache, block_tables,
                      torch.tensor([c + q for c, q in seqs], dtype=torch.int32),
                      torch.tensor(qsl, dtype=torch.int32), query, num_heads, head_size ** -0.5)


def tolerances(dtype):
    return dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=2e-5, rtol=1e-4)


# Kernel ISAs whose attention takes a bf16 cache through the pair-dot tiles (attention_dot_tiles.h).
PAIR_DOT_ISAS = ("generic16_bf16", "avx512_bf16")


def attention_tolerances(q_dtype, cache_dtype, head_size=64):
    """tolerances(q_dtype), except where the active ISA's pair-dot tiles apply (a bf16 cache, a head
    size that is a multiple of 32): they round an fp32 query and the probabilities to bf16, so 8e-3."""
    if _core.kernel_isa() in PAIR_DOT_ISAS and cache_dtype == torch.bfloat16 and head_size % 32 == 0:
        return dict(atol=8e-3, rtol=8e-3)
    return tolerances(q_dtype)
