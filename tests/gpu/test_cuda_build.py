"""CPU-only checks of the CUDA build: the extension says it has CUDA when a toolkit was there, and
the CUDA entry points refuse CPU tensors (or a missing NCCL) with clear errors instead of crashing."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

import pagedcore._core as _core
from pagedcore.ops import attention_cuda as kernels_cuda


def nvcc_path() -> str | None:
    for candidate in (os.environ.get("CUDACXX"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.mark.skipif(nvcc_path() is None, reason="no nvcc on this machine: a CPU-only build is expected")
@pytest.mark.skipif(os.environ.get("PAGEDCORE_EXPECT_CUDA") == "0", reason="PAGEDCORE_EXPECT_CUDA=0")
def test_has_cuda_when_the_build_found_nvcc():
    assert _core.has_cuda is True, (
        f"nvcc is at {nvcc_path()} but pagedcore._core was built without CUDA; rebuild (scripts/dev-build), or "
        "set PAGEDCORE_EXPECT_CUDA=0 if CUDA was switched off on purpose (-DPAGEDCORE_CUDA=OFF)")
    assert _core.cuda_device_count() >= 0  # 0 without a driver or GPU, and no crash


def cpu_batch():
    cache = torch.zeros(3, 2, 16, 64)
    q = torch.zeros(2, 4, 64)
    return dict(out=torch.empty_like(q), query=q, key_cache=cache, value_cache=cache.clone(),
                block_tables=torch.zeros(2, 1, dtype=torch.int32), seq_lens=torch.ones(2, dtype=torch.int32),
                query_start_loc=torch.tensor([0, 1, 2], dtype=torch.int32), scale=0.125)


def test_cpu_tensors_raise_value_error():
    with pytest.raises(ValueError, match="CUDA tensors.*pagedcore.ops.attention.paged_attention"):
        kernels_cuda.paged_attention(**cpu_batch())
    k = torch.zeros(2, 2, 64)
    cache = torch.zeros(3, 2, 16, 64)
    with pytest.raises(ValueError, match="CUDA tensors"):
        kernels_cuda.reshape_and_cache(k, k, cache, cache.clone(), torch.zeros(2, dtype=torch.int64))
    kv = torch.zeros(2, 2, 4, 2, 16, 64)
    with pytest.raises(ValueError, match="CUDA tensors"):
        kernels_cuda.copy_blocks(kv, torch.tensor([[0, 1]], dtype=torch.int32))
    with pytest.raises(ValueError, match="neither cache is on CUDA"):
        kernels_cuda.swap_blocks(kv, kv.clone(), torch.tensor([[0, 1]], dtype=torch.int32))
    with pytest.raises(TypeError, match="torch.Tensor"):
        kernels_cuda.paged_attention(**{**cpu_batch(), "query": [[0.0]]})


@pytest.mark.skipif(not getattr(_core, "has_cuda", False), reason="built without CUDA")
def test_raw_entry_points_report_errors_without_a_gpu():
    # head_size 96: refused before anything touches the (fake) pointers
    with pytest.raises(ValueError, match="head_size 96"):
        _core.paged_attention_cuda(16, 16, 16, 16, 16, 16, 16, 1, 1, 4, 2, 96, 3, 16, 1, 192, 64, 192, 64,
                                   1, 1, 0.1, 1, 16, 0, 0, 0, 0, 0, 0)
    if _core.cuda_device_count() == 0:
        with pytest.raises(RuntimeError, match="reshape_and_cache failed: cuda"):
            _core.reshape_and_cache_cuda(16, 16, 16, 16, 16, 1, 2, 64, 3, 16, 128, 64, 128, 64, 1, 1, 0)


@pytest.mark.skipif(not getattr(_core, "has_cuda", False), reason="built without CUDA")
def test_missing_nccl_library_is_a_clear_error():
    with pytest.raises(RuntimeError, match="NCCL"):
        _core.NcclCommunicator.get_unique_id("/nonexistent/libnccl.so.2")


def test_tuning_validation():
    with pytest.raises(ValueError, match="decode"):
        kernels_cuda.set_attention_tuning(decode="fast")
    kernels_cuda.set_attention_tuning()
