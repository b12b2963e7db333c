"""The CPU's block-major KV cache (kv_cache.allocate): the same [num_layers, 2, num_blocks, ...] tensor
as a layer-major one, with every layer's K and V of a block together in memory. Each kernel must give
bit for bit what it gives on a contiguous cache holding the same values, and never touch another
layer's planes."""

from __future__ import annotations

import pytest
import torch

from pagedcore.engine import kv_cache as kvc
from pagedcore.ops import attention as kernels
from pagedcore.ops import checks

from . import reference
from .conftest import make_batch

MIXED = [(37, 1), (0, 21), (100, 1), (5, 40), (16, 16), (250, 1), (3, 1), (70, 33)]


def block_major(num_layers, num_blocks, num_kv_heads, block_size, head_size, dtype, fill=float("nan")):
    """[num_layers, 2, num_blocks, ...] over [num_blocks, num_layers, 2, ...] memory, filled with `fill`."""
    spec = kvc.KVCacheSpec(num_layers, num_kv_heads, head_size, block_size, dtype)
    cache = kvc.allocate(spec, num_blocks, "cpu", block_major=True)
    assert cache.permute(2, 0, 1, 3, 4, 5).is_contiguous() and not cache.is_contiguous()
    return cache.fill_(fill)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [16, 128])
def test_attention_on_a_block_major_layer_equals_the_contiguous_cache(isa, cache_dtype, block_size):
    batch = make_batch(MIXED, num_heads=9, num_kv_heads=3, head_size=64, block_size=block_size,
                       cache_dtype=cache_dtype, seed=3)
    num_blocks = batch.key_cache.shape[0]
    cache = block_major(3, num_blocks, 3, block_size, 64, cache_dtype)
    cache[1, 0].copy_(batch.key_cache)
    cache[1, 1].copy_(batch.value_cache)          # layers 0 and 2 stay NaN: any read of them shows
    args = (batch.block_tables, batch.seq_lens, batch.query_start_loc, batch.scale)
    want = torch.full_like(batch.query, float("nan"))
    kernels.paged_attention(want, batch.query, batch.key_cache, batch.value_cache, *args)
    got = torch.full_like(batch.query, float("nan"))
    kernels.paged_attention(got, batch.query, cache[1, 0], cache[1, 1], *args)
    assert torch.equal(got, want)
    oracle = torch.zeros_like(batch.query)
    reference.paged_attention(oracle, batch.query, batch.key_cache, batch.value_cache, *args)
    torch.testing.assert_close(got, oracle, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_reshape_and_cache_writes_only_its_layer(cache_dtype):
    gen = torch.Generator().manual_seed(1)
    num_tokens, num_blocks = 50, 9
    key = torch.randn(num_tokens, 2, 32, generator=gen)
    value = torch.randn(num_tokens, 2, 32, generator=gen)
    slots = torch.randperm(num_blocks * 8, generator=gen)[:num_tokens].to(torch.int64)
    slots[::7] = -1                                                    # padding writes nothing
    cache = block_major(4, num_blocks, 2, 8, 32, cache_dtype, fill=0.0)
    kernels.reshape_and_cache(key, value, cache[2, 0], cache[2, 1], slots)
    want_k = torch.zeros(num_blocks, 2, 8, 32, dtype=cache_dtype)
    want_v = torch.zeros_like(want_k)
    reference.reshape_and_cache(key, value, want_k, want_v, slots)
    assert torch.equal(cache[2, 0], want_k) and torch.equal(cache[2, 1], want_v)
    others = [cache[layer] for layer in (0, 1, 3)]
    assert all(torch.count_nonzero(o) == 0 for o in others)


def test_copy_and_swap_blocks_across_layouts():
    gen = torch.Generator().manual_seed(2)
    layer_major = torch.randn(3, 2, 12, 3, 16, 64, generator=gen)
    cache = block_major(3, 12, 3, 16, 64, torch.float32)
    cache.copy_(layer_major)
    mapping = torch.tensor([[3, 7], [7, 1], [1, 3]], dtype=torch.int32)   # a chain: row order matters
    kernels.copy_blocks(cache, mapping)
    reference.copy_blocks(layer_major, mapping)
    assert torch.equal(cache, layer_major)
    pool = torch.zeros(3, 2, 5, 3, 16, 64)                                # a layer-major swap pool
    out = torch.tensor([[0, 4], [11, 0], [6, 2]], dtype=torch.int32)
    kernels.swap_blocks(cache, pool, out)
    assert torch.equal(pool[:, :, [4, 0, 2]], layer_major[:, :, [0, 11, 6]])
    back = block_major(3, 12, 3, 16, 64, torch.float32, fill=0.0)
    kernels.swap_blocks(pool, back, out.flip(1))
    assert torch.equal(back[:, :, [0, 11, 6]], layer_major[:, :, [0, 11, 6]])
    assert torch.count_nonzero(back[:, :, [1, 2, 3, 4, 5, 7, 8, 9, 10]]) == 0


def test_a_slice_of_the_first_layers_keeps_its_strides():
    """The layer-skip draft runs the target's first layers: cache[:n] of a block-major cache."""
    cache = block_major(6, 10, 2, 16, 64, torch.bfloat16)
    block = 2 * 16 * 64
    assert checks.kv_cache_strides(cache) == (2 * block, block, 6 * 2 * block)
    assert checks.kv_cache_strides(cache[:2]) == (2 * block, block, 6 * 2 * block)
    assert checks.kv_cache_strides(torch.zeros(6, 2, 10, 2, 16, 64)) == (2 * 10 * block, 10 * block, block)


def test_other_strides_are_refused_with_the_fix():
    cache = torch.zeros(2, 2, 10, 2, 16, 64)
    odd = cache.permute(0, 1, 2, 4, 3, 5)                                # heads and rows swapped
    with pytest.raises(ValueError, match="block-major"):
        kernels.copy_blocks(odd, torch.tensor([[0, 1]], dtype=torch.int32))
    with pytest.raises(ValueError, match="strides"):
        kernels.reshape_and_cache(torch.zeros(1, 16, 64), torch.zeros(1, 16, 64), odd[0, 0], odd[0, 1],
                                  torch.zeros(1, dtype=torch.int64))
    value_cache = torch.zeros(20, 2, 16, 64)[::2]                       # V laid out unlike K
    with pytest.raises(ValueError, match="strides"):
        kernels.paged_attention(torch.zeros(1, 2, 64), torch.zeros(1, 2, 64), cache[0, 0], value_cache,
                                torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32),
                                torch.tensor([0, 1], dtype=torch.int32), 0.125)


def test_allocate_chooses_the_layout(monkeypatch):
    spec = kvc.KVCacheSpec(2, 2, 64, 16, torch.float32)
    assert not kvc.allocate(spec, 4).is_contiguous()                     # CPU default: block-major
    monkeypatch.setenv("PAGEDCORE_KV_LAYOUT", "layer_major")
    assert kvc.allocate(spec, 4).is_contiguous()
    monkeypatch.setenv("PAGEDCORE_KV_LAYOUT", "sideways")
    with pytest.raises(ValueError, match="block_major or layer_major"):
        kvc.allocate(spec, 4)
