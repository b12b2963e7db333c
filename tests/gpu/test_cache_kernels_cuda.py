"""CUDA reshape_and_cache, copy_blocks and swap_blocks against tests.kernels.reference."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.conftest import requires_cuda
from tests.kernels import reference

pytestmark = [pytest.mark.gpu, requires_cuda]

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def random_slots(num_tokens, num_blocks, block_size, num_pad, seed):
    gen = torch.Generator().manual_seed(seed)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[torch.randperm(num_tokens, generator=gen)[:num_pad]] = -1
    return slots.to(torch.int64)


@pytest.mark.parametrize("src_dtype", DTYPES)
@pytest.mark.parametrize("cache_dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 37, 3000])
def test_reshape_and_cache_matches_reference(kernels_cuda, src_dtype, cache_dtype, num_tokens):
    num_blocks, num_kv_heads, block_size, head_size = 400, 3, 16, 128
    gen = torch.Generator().manual_seed(num_tokens)
    # key/value as slices of a fused qkv output: [T, (H + 2 * Hkv), D] viewed per head.
    qkv = torch.randn(num_tokens, 9 + 2 * num_kv_heads, head_size, generator=gen).to(src_dtype)
    key, value = qkv[:, 9:9 + num_kv_heads], qkv[:, 9 + num_kv_heads:]
    slots = random_slots(num_tokens, num_blocks, block_size, num_pad=num_tokens // 5, seed=1)
    caches = [torch.randn(num_blocks, num_kv_heads, block_size, head_size, generator=gen).to(cache_dtype)
              for _ in range(2)]
    want = [c.clone() for c in caches]
    reference.reshape_and_cache(key, value, want[0], want[1], slots)
    got = [c.cuda() for c in caches]
    qkv_gpu = qkv.cuda()
    kernels_cuda.reshape_and_cache(qkv_gpu[:, 9:9 + num_kv_heads], qkv_gpu[:, 9 + num_kv_heads:], got[0], got[1],
                                   slots.cuda())
    torch.cuda.synchronize()
    # bit-exact, conversions included (round to nearest even, like torch)
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])


def test_fp32_to_16_bit_rounding_ties_and_specials(kernels_cuda):
    values = torch.tensor([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -1.0 - 2 ** -8, 3.4e38, float("inf"),
                           float("-inf"), 1e-40, -0.0, 65504.0, 65520.0, 1.00390625, 1.01171875,
                           0.1, -7.3, 2 ** -130, 1.0 + 2 ** -9] + [0.0] * 48)  # 64 = head_size
    key = values.view(1, 1, 64).cuda()
    for dtype in (torch.bfloat16, torch.float16):
        cache = torch.zeros(1, 1, 1, 64, dtype=dtype, device="cuda")
        vcache = torch.zeros_like(cache)
        kernels_cuda.reshape_and_cache(key, key, cache, vcache, torch.tensor([0], device="cuda"))
        want = values.to(dtype)
        got = cache[0, 0, 0].cpu()
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), dtype


def test_padding_and_out_of_range_slots_write_nothing(kernels_cuda):
    cache = torch.zeros(4, 2, 8, 64, device="cuda")
    vcache = torch.zeros_like(cache)
    key = torch.ones(4, 2, 64, device="cuda")
    kernels_cuda.reshape_and_cache(key, key * 2, cache, vcache, torch.tensor([-1, 9, -1, 4 * 8 + 3], device="cuda"))
    torch.cuda.synchronize()
    assert cache.sum().item() == 2 * 64 and vcache.sum().item() == 2 * 2 * 64
    assert bool((cache[1, :, 1] == 1).all()) and bool((vcache[1, :, 1] == 2).all())


def make_kv_cache(num_layers, num_blocks, dtype=torch.bfloat16, device="cuda", seed=0, pin=False):
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(num_layers, 2, num_blocks, 2, 16, 64, generator=gen).to(dtype)
    if device == "cpu":
        return t.pin_memory() if pin else t
    return t.to(device)


@pytest.mark.parametrize("dtype", DTYPES)
def test_copy_blocks_rows_act_in_order(kernels_cuda, dtype):
    kv = make_kv_cache(3, 12, dtype)
    want = kv.cpu()
    # a chain (1 -> 2 then 2 -> 3 copies the new block 2), a write after read (5 -> 6, 7 -> 5)
    mapping = torch.tensor([[1, 2], [2, 3], [5, 6], [7, 5], [0, 11]], dtype=torch.int32)
    reference.copy_blocks(want, mapping)
    kernels_cuda.copy_blocks(kv, mapping)
    torch.cuda.synchronize()
    assert torch.equal(kv.cpu(), want)


def test_copy_blocks_with_a_device_mapping(kernels_cuda):
    kv = make_kv_cache(2, 10)
    want = kv.cpu()
    mapping = torch.tensor([[0, 4], [1, 5], [2, 9]], dtype=torch.int32)  # independent, as copy-on-write lists are
    reference.copy_blocks(want, mapping)
    kernels_cuda.copy_blocks(kv, mapping.cuda())
    torch.cuda.synchronize()
    assert torch.equal(kv.cpu(), want)


def test_copy_blocks_checks_host_ids(kernels_cuda):
    kv = make_kv_cache(1, 4)
    with pytest.raises(IndexError, match=r"\[0, 4\)"):
        kernels_cuda.copy_blocks(kv, torch.tensor([[0, 4]], dtype=torch.int32))


@pytest.mark.parametrize("direction", ["gpu_to_pinned", "pinned_to_gpu", "pageable_to_gpu", "gpu_to_pageable"])
def test_swap_blocks(kernels_cuda, direction):
    src_on_gpu = direction.startswith("gpu")
    pinned = "pinned" in direction
    src = make_kv_cache(4, 12, device="cuda" if src_on_gpu else "cpu", pin=pinned, seed=1)
    dst = make_kv_cache(4, 7, device="cpu" if src_on_gpu else "cuda", pin=pinned, seed=2)
    want = dst.cpu().clone()
    # rows 2->0, 3->1, 4->2 merge into one strided copy; then two single rows
    mapping = torch.tensor([[2, 0], [3, 1], [4, 2], [11, 6], [0, 4]], dtype=torch.int32)
    reference.swap_blocks(src.cpu(), want, mapping)
    kernels_cuda.swap_blocks(src, dst, mapping)
    torch.cuda.synchronize()
    assert torch.equal(dst.cpu(), want)


def test_swap_blocks_misuse(kernels_cuda):
    gpu = make_kv_cache(1, 4)
    cpu = make_kv_cache(1, 4, device="cpu")
    with pytest.raises(IndexError):
        kernels_cuda.swap_blocks(gpu, cpu, torch.tensor([[4, 0]], dtype=torch.int32))
    with pytest.raises(ValueError, match="same cache twice"):
        kernels_cuda.swap_blocks(gpu, gpu, torch.tensor([[0, 1]], dtype=torch.int32))
    with pytest.raises(ValueError, match="neither cache is on CUDA"):
        kernels_cuda.swap_blocks(cpu, cpu.clone(), torch.tensor([[0, 1]], dtype=torch.int32))
    with pytest.raises(TypeError, match="same dtype"):
        kernels_cuda.swap_blocks(gpu, cpu.float(), torch.tensor([[0, 1]], dtype=torch.int32))
    with pytest.raises(ValueError, match="num_blocks"):
        kernels_cuda.swap_blocks(gpu, make_kv_cache(2, 4, device="cpu"), torch.tensor([[0, 1]], dtype=torch.int32))
