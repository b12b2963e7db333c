"""An fp8 KV cache (--kv-cache-dtype fp8 / fp8_e4m3 / fp8_e5m2): the kernels write torch's own
float8_e4m3fn / float8_e5m2 values (nearest, ties to even; past the largest finite value they
saturate, where torch's cast gives NaN or inf), and attention over it equals the torch reference on
those values widened, on every ISA this CPU runs."""

from __future__ import annotations

import pytest
import torch

from pagedcore.ops import attention as kernels

from . import reference
from .conftest import PAIR_DOT_ISAS, make_batch

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
MIXED = [(37, 1), (0, 21), (100, 1), (5, 40), (16, 16), (250, 1), (3, 1), (70, 33)]


@pytest.mark.parametrize("cache_dtype", FP8)
@pytest.mark.parametrize("src_dtype", [torch.float32, torch.bfloat16])
def test_reshape_and_cache_writes_torchs_fp8_values(cache_dtype, src_dtype):
    gen = torch.Generator().manual_seed(4)
    num_tokens, num_blocks = 300, 24
    # Magnitudes from the subnormals (e4m3 below 2^-6, e5m2 below 2^-14) to near the largest value.
    spread = torch.pow(2.0, torch.randint(-18, 7, (num_tokens, 2, 64), generator=gen).float())
    key = (torch.randn(num_tokens, 2, 64, generator=gen) * spread).to(src_dtype)
    value = (torch.randn(num_tokens, 2, 64, generator=gen) * spread).to(src_dtype)
    slots = torch.randperm(num_blocks * 16, generator=gen)[:num_tokens].to(torch.int64)
    slots[::11] = -1
    got_k = torch.zeros(num_blocks, 2, 16, 64, dtype=cache_dtype)
    got_v = torch.zeros_like(got_k)
    kernels.reshape_and_cache(key, value, got_k, got_v, slots)
    want_k, want_v = torch.zeros_like(got_k), torch.zeros_like(got_v)
    reference.reshape_and_cache(key.float(), value.float(), want_k, want_v, slots)
    assert torch.equal(got_k.view(torch.uint8), want_k.view(torch.uint8))   # bit for bit, -0 included
    assert torch.equal(got_v.view(torch.uint8), want_v.view(torch.uint8))


@pytest.mark.parametrize("cache_dtype", FP8)
def test_out_of_range_values_saturate(cache_dtype):
    big = torch.finfo(cache_dtype).max
    key = torch.tensor([[[big * 8, -big * 8, float("inf"), float("-inf"), big, 1.0, float("nan"), 0.0]]])
    cache = torch.zeros(1, 1, 16, 8, dtype=cache_dtype)
    kernels.reshape_and_cache(key, key, cache, cache.clone(), torch.tensor([3]))
    got = cache[0, 0, 3].float()
    assert got[:6].tolist() == [big, -big, big, -big, big, 1.0]
    assert torch.isnan(got[6]) and got[7] == 0


@pytest.mark.parametrize("cache_dtype", FP8)
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [16, 128])
def test_attention_over_an_fp8_cache(isa, cache_dtype, q_dtype, block_size):
    batch = make_batch(MIXED, num_heads=9, num_kv_heads=3, head_size=64, block_size=block_size,
                       cache_dtype=cache_dtype, q_dtype=q_dtype, seed=6)
    args = (batch.key_cache, batch.value_cache, batch.block_tables, batch.seq_lens, batch.query_start_loc,
            batch.scale)
    out = torch.full_like(batch.query, float("nan"))
    kernels.paged_attention(out, batch.query, *args)
    want = torch.zeros_like(batch.query)
    reference.paged_attention(want, batch.query, *args)
    # fp8 widens exactly; the pair-dot tiles (planes widened to bf16) round the query and probabilities.
    tol = 8e-3 if isa in PAIR_DOT_ISAS and q_dtype == torch.float32 else 2e-2 if q_dtype == torch.bfloat16 else 2e-5
    torch.testing.assert_close(out, want, atol=tol, rtol=tol)
