"""Committing a host tensor's pages up front, so the process's resident memory is what it reserved.

torch.empty on the CPU maps memory that the kernel backs with pages only when first written. The KV
cache is one such reservation of gigabytes, and the block pool's LRU free list walks every block
before it reuses one (that is what keeps the prefix cache's contents longest), so an uncommitted
cache made the server's RSS climb by every newly touched block until the whole cache was resident:
hundreds of MB per minute under load, never returned, and an out-of-memory kill hours after start
instead of a clear error at start (issue "Memory grows without bound under load").
Committing at start-up gives a flat RSS from the first request on and moves the page faults out of
the step loop.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap

import torch

from pagedcore import _core

_MADV_POPULATE_WRITE = 23   # Linux >= 5.14: fault the pages in, writable, inside one system call
_PAGE_SIZE = mmap.PAGESIZE


def _madvise():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise.restype = ctypes.c_int
        return libc.madvise
    except (OSError, AttributeError):
        return None


def commit_pages(tensor: torch.Tensor, huge_pages: bool = False) -> tuple[int, int]:
    """Makes every page of a contiguous CPU tensor resident now. The contents stay undefined (the
    kernel zero-fills the pages, or the fallback writes a zero byte per page). huge_pages first
    advises the range onto 2 MB transparent huge pages: on a quiet machine the populate then takes
    ~0.13 s a GiB against ~0.9 s in 4 KB pages, but where memory must be compacted first it took
    3 s a GiB (`bench/bench_memory.py commit`; the engine measures it at start-up, see kv_cache.allocate).
    Returns (bytes committed, bytes advised onto huge pages)."""
    if not tensor.is_cpu or tensor.numel() == 0:
        return 0, 0
    if not tensor.is_contiguous():
        raise ValueError("commit_pages needs a contiguous tensor")
    num_bytes = tensor.numel() * tensor.element_size()
    start = tensor.data_ptr()
    advised = _core.advise_huge_pages(start, num_bytes) if huge_pages else 0
    begin = (start + _PAGE_SIZE - 1) // _PAGE_SIZE * _PAGE_SIZE      # first whole page
    end = (start + num_bytes) // _PAGE_SIZE * _PAGE_SIZE              # past the last whole page
    madvise = _madvise()
    flat = tensor.view(-1).view(torch.uint8)                          # [num_bytes]
    # One call over the whole range: split into chunks on threads it ran 5-50x slower with huge pages.
    if madvise is not None and end > begin and madvise(begin, end - begin, _MADV_POPULATE_WRITE) == 0:
        flat[0] = 0                                                   # the partial pages at each end
        flat[-1] = 0
    else:
        # Old kernels (EINVAL) or no libc: one write per page faults each in. Slower (a trap per page),
        # same result. The cache holds no data yet, so overwriting a byte per page is harmless.
        flat[::_PAGE_SIZE].zero_()
        flat[-1] = 0
    return num_bytes, advised
