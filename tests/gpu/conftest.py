"""Shared pieces of the CUDA tests: the skip rule and random paged batches on the GPU.

Every test module here marks itself `gpu` and skips, with the reason, when the extension was built
without CUDA or torch sees no GPU (the CPU-only torch wheel, a machine without one).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

import pagedcore._core as _core


def cuda_skip_reason() -> str | None:
    if not getattr(_core, "has_cuda", False):
        return "pagedcore._core was built without CUDA (no CUDA toolkit at build time)"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device (a CPU-only build or no GPU here)"
    return None


requires_cuda = pytest.mark.skipif(cuda_skip_reason() is not None, reason=str(cuda_skip_reason()))


@pytest.fixture
def kernels_cuda():
    """pagedcore.ops.attention_cuda with the default tuning restored after the test."""
    from pagedcore.ops import attention_cuda as module

    module.set_attention_tuning()
    yield module
    module.set_attention_tuning()


@dataclass
class PagedBatch:
    """A mixed batch over one layer's cache on the GPU; every slot no sequence owns holds NaN."""

    key_cache: torch.Tensor  # [num_blocks, num_kv_heads, block_size, head_size]
    value_cache: torch.Tensor
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks_per_seq], -1 padded
    seq_lens: torch.Tensor  # int32 [num_seqs]
    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]
    query: torch.Tensor  # [num_tokens, num_heads, head_size], a non-contiguous view
    scale: float
    max_query_len: int
    max_seq_len: int

    def out_like_query(self) -> torch.Tensor:
        """A strided out ([T, H, D] slice of a [T, H + 1, D] buffer) filled with a sentinel."""
        t, h, d = self.query.shape
        return torch.full((t, h + 1, d), 4096.0, dtype=self.query.dtype, device=self.query.device)[:, :h]

    def reference(self) -> torch.Tensor:
        """tests.kernels.reference on CPU copies, in fp32."""
        from tests.kernels import reference

        out = torch.zeros(self.query.shape, dtype=torch.float32)
        reference.paged_attention(out, self.query.cpu(), self.key_cache.cpu(), self.value_cache.cpu(),
                                  self.block_tables.cpu(), self.seq_lens.cpu(), self.query_start_loc.cpu(),
                                  self.scale)
        return out


def make_batch(seqs, *, num_heads, num_kv_heads, head_size, block_size, cache_dtype=torch.bfloat16,
               q_dtype=None, extra_blocks=7, extra_columns=2, seed=0, device="cuda") -> PagedBatch:
    """seqs: (context_len, q_len) per sequence; seq_len = context_len + q_len. Block ids are shuffled."""
    q_dtype = cache_dtype if q_dtype is None else q_dtype
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
        # scatter whole sequences at once: position p -> (block_tables[s, p // bs], p % bs)
        pos = torch.arange(seq_len)
        blocks = block_tables[s, pos // block_size].long()
        key_cache[blocks, :, pos % block_size] = k.to(cache_dtype)
        value_cache[blocks, :, pos % block_size] = v.to(cache_dtype)
    num_tokens = sum(q for _, q in seqs)
    # A slice of a wider buffer, as a fused qkv projection hands it over: strides (3*H*D, D, 1).
    fused = torch.randn(num_tokens, 3 * num_heads, head_size, generator=gen).to(q_dtype)
    qsl = [0]
    for _, q in seqs:
        qsl.append(qsl[-1] + q)
    fused = fused.to(device)
    return PagedBatch(key_cache.to(device), value_cache.to(device), block_tables.to(device),
                      torch.tensor([c + q for c, q in seqs], dtype=torch.int32, device=device),
                      torch.tensor(qsl, dtype=torch.int32, device=device),
                      fused[:, num_heads:2 * num_heads], head_size ** -0.5,
                      max(q for _, q in seqs), max(c + q for c, q in seqs))


def tolerances(dtype) -> dict:
    """bf16/fp16 round the output (and, on tensor cores, the probabilities) to 16 bits."""
    if dtype == torch.bfloat16:
        return dict(atol=2e-2, rtol=2e-2)
    if dtype == torch.float16:
        return dict(atol=4e-3, rtol=4e-3)
    return dict(atol=1e-4, rtol=1e-4)
