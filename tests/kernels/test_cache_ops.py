"""reshape_and_cache, copy_blocks and swap_blocks (C++) against the torch reference."""

from __future__ import annotations

import pytest
import torch

from pagedcore.ops import attention as kernels

from . import reference


def random_slots(num_tokens, num_blocks, block_size, num_pad, seed):
    gen = torch.Generator().manual_seed(seed)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[torch.randperm(num_tokens, generator=gen)[:num_pad]] = -1
    return slots.to(torch.int64)


@pytest.mark.parametrize("src_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [1, 37, 3000])  # 3000 tokens crosses the threading threshold
def test_reshape_and_cache_matches_reference(src_dtype, cache_dtype, num_tokens):
    num_blocks, num_kv_heads, block_size, head_size = 400, 3, 16, 64
    gen = torch.Generator().manual_seed(num_tokens)
    # key/value as slices of a fused qkv output: [T, (H + 2 * Hkv) * D] viewed per head.
    qkv = torch.randn(num_tokens, 9 + 2 * num_kv_heads, head_size, generator=gen).to(src_dtype)
    key, value = qkv[:, 9:9 + num_kv_heads], qkv[:, 9 + num_kv_heads:]
    assert num_tokens == 1 or not key.is_contiguous()
    slots = random_slots(num_tokens, num_blocks, block_size, num_pad=num_tokens // 5, seed=1)
    caches = [torch.randn(num_blocks, num_kv_heads, block_size, head_size, generator=gen).to(cache_dtype)
              for _ in range(2)]
    want = [c.clone() for c in caches]
    kernels.reshape_and_cache(key, value, caches[0], caches[1], slots)
    reference.reshape_and_cache(key, value, want[0], want[1], slots)
    # bit-exact, fp32 -> bf16 included (round to nearest even, like torch)
    assert torch.equal(caches[0], want[0]) and torch.equal(caches[1], want[1])


def test_fp32_to_bf16_rounding_ties_and_specials():
    values = torch.tensor([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -1.0 - 2 ** -8, 3.4e38, float("inf"),
                           float("-inf"), float("nan"), 1e-40, -0.0, 65504.0, 1.00390625, 1.01171875,
                           0.1, -7.3, 2 ** -130, 1.0 + 2 ** -9] + [0.0] * 48)  # 64 = head_size
    key = values.view(1, 1, 64)
    cache = torch.zeros(1, 1, 1, 64, dtype=torch.bfloat16)
    vcache = torch.zeros_like(cache)
    kernels.reshape_and_cache(key, key, cache, vcache, torch.tensor([0]))
    want = values.to(torch.bfloat16)
    got = cache[0, 0, 0]
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[~want.isnan()].view(torch.int16), want[~want.isnan()].view(torch.int16))


def test_padding_slots_write_nothing():
    cache = torch.zeros(4, 2, 8, 16)
    vcache = torch.zeros_like(cache)
    key = torch.ones(3, 2, 16)
    kernels.reshape_and_cache(key, key * 2, cache, vcache, torch.tensor([-1, 9, -1]))
    assert cache.sum() == 2 * 16 and vcache.sum() == 2 * 2 * 16
    assert (cache[1, :, 1] == 1).all() and (vcache[1, :, 1] == 2).all()


def make_kv_cache(num_layers, num_blocks, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num_layers, 2, num_blocks, 3, 16, 64, generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mapping", [[[3, 7], [0, 1], [9, 2]],  # independent: may run in parallel
                                     [[3, 7], [7, 1], [1, 3]],  # a chain: row order matters
                                     [[5, 5], [2, 4], [4, 6]]])
def test_copy_blocks_matches_reference(dtype, mapping):
    kv = make_kv_cache(4, 12, dtype)
    want = kv.clone()
    block_mapping = torch.tensor(mapping, dtype=torch.int32)
    kernels.copy_blocks(kv, block_mapping)
    reference.copy_blocks(want, block_mapping)
    assert torch.equal(kv, want)


def test_copy_blocks_large_parallel():
    kv = make_kv_cache(8, 200)
    want = kv.clone()
    mapping = torch.stack([torch.arange(0, 100), torch.arange(100, 200)], dim=1).to(torch.int32)
    kernels.copy_blocks(kv, mapping)
    reference.copy_blocks(want, mapping)
    assert torch.equal(kv, want)


def test_swap_blocks_between_caches_of_different_sizes():
    src, dst = make_kv_cache(3, 10, seed=1), make_kv_cache(3, 25, seed=2)
    want = dst.clone()
    mapping = torch.tensor([[0, 24], [9, 3], [4, 4]], dtype=torch.int32)
    kernels.swap_blocks(src, dst, mapping)
    reference.swap_blocks(src, want, mapping)
    assert torch.equal(dst, want)
    back = make_kv_cache(3, 10, seed=3)
    kernels.swap_blocks(dst, back, mapping.flip(1))
    assert torch.equal(back[:, :, [0, 9, 4]], src[:, :, [0, 9, 4]])


def test_block_mapping_int64_is_accepted():
    kv = make_kv_cache(1, 4)
    want = kv.clone()
    kernels.copy_blocks(kv, torch.tensor([[0, 3]]))
    reference.copy_blocks(want, torch.tensor([[0, 3]]))
    assert torch.equal(kv, want)
