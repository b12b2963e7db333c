"""advise_huge_pages: the range is trimmed inward to whole 2 MB pages, small ranges are a no-op,
and the KV cache allocator still hands back a usable, correctly shaped tensor after advising it."""

from __future__ import annotations

import sys

import pytest
import torch

from pagedcore import _core
from pagedcore.engine import kv_cache as kvc

HUGE = 2 << 20


def test_range_is_trimmed_to_whole_huge_pages():
    buf = torch.empty(9 * HUGE, dtype=torch.uint8)
    ptr, n = buf.data_ptr(), buf.numel()
    advised = _core.advise_huge_pages(ptr, n)
    if sys.platform.startswith("linux") and advised:
        begin = -(-ptr // HUGE) * HUGE
        end = (ptr + n) // HUGE * HUGE
        assert advised == end - begin and advised % HUGE == 0 and advised >= 7 * HUGE
    assert _core.advise_huge_pages(ptr, HUGE - 1) == 0  # never a whole huge page
    assert _core.advise_huge_pages(ptr, 0) == 0
    buf.fill_(7)  # the memory is ordinary memory afterwards
    assert int(buf[::HUGE].sum()) == 7 * len(buf[::HUGE])


@pytest.mark.parametrize("huge_pages", ["0", "1"])
def test_kv_cache_allocation_is_usable_advised_or_not(monkeypatch, huge_pages):
    monkeypatch.setenv("PAGEDCORE_KV_HUGE_PAGES", huge_pages)
    spec = kvc.KVCacheSpec(num_layers=2, num_kv_heads=3, head_dim=64, block_size=16, dtype=torch.float32)
    cache = kvc.allocate(spec, num_blocks=600)
    assert cache.shape == spec.shape(600) and cache.permute(2, 0, 1, 3, 4, 5).is_contiguous()  # block-major
    cache.zero_()
    cache[1, 0, 599] = 1.5
    assert float(cache.sum()) == 1.5 * 3 * 16 * 64
