"""Misuse of the kernel functions raises a Python exception that names the fix; nothing crashes
and nothing is written."""

from __future__ import annotations

import pytest
import torch

from pagedcore.ops import attention as kernels


def attention_args(**override):
    num_blocks, hkv, bs, d, h = 8, 2, 16, 64, 4
    args = dict(out=torch.empty(3, h, d), query=torch.randn(3, h, d),
                key_cache=torch.zeros(num_blocks, hkv, bs, d), value_cache=torch.zeros(num_blocks, hkv, bs, d),
                block_tables=torch.tensor([[0, 1, -1], [2, -1, -1]], dtype=torch.int32),
                seq_lens=torch.tensor([20, 5], dtype=torch.int32),
                query_start_loc=torch.tensor([0, 2, 3], dtype=torch.int32), scale=0.125)
    args.update(override)
    return args


def call_attention(**override):
    a = attention_args(**override)
    kernels.paged_attention(a.pop("out"), a.pop("query"), **a)


def test_valid_call_passes():
    call_attention()


@pytest.mark.parametrize("override,exc,match", [
    (dict(query=torch.randn(3, 4, 64, dtype=torch.float64)), TypeError, "float32 or torch.bfloat16"),
    (dict(out=torch.empty(3, 4, 64, dtype=torch.bfloat16)), TypeError, "empty_like"),
    (dict(query=torch.randn(3, 4, 32)), ValueError, "head_size"),
    (dict(query=torch.randn(3, 3, 64), out=torch.empty(3, 3, 64)), ValueError, "multiple"),
    (dict(query=torch.randn(3, 64, 4).transpose(1, 2)), ValueError, "unit stride"),
    (dict(query=torch.randn(12, 64)), ValueError, "num_tokens, num_heads, head_size"),
    (dict(out=torch.empty(2, 4, 64)), ValueError, "like query"),
    (dict(key_cache=torch.zeros(8, 2, 64, 16).transpose(2, 3)), ValueError, "contiguous"),
    (dict(value_cache=torch.zeros(8, 2, 16, 64, dtype=torch.bfloat16)), ValueError, "must match"),
    (dict(block_tables=torch.tensor([[0, 1, -1], [2, -1, -1]])), TypeError, "int32"),
    (dict(block_tables=torch.tensor([[0, 1, -1], [2, -1, -1]], dtype=torch.int32).t().contiguous().t()),
     ValueError, "contiguous"),
    (dict(seq_lens=torch.tensor([20, 5, 1], dtype=torch.int32)), ValueError, "seq_lens"),
    (dict(query_start_loc=torch.tensor([0, 2], dtype=torch.int32)), ValueError, "query_start_loc"),
    (dict(query_start_loc=torch.tensor([0, 2, 4], dtype=torch.int32)), ValueError, "query has 3 rows"),
    (dict(query_start_loc=torch.tensor([1, 2, 3], dtype=torch.int32)), ValueError, "must be 0"),
    (dict(query_start_loc=torch.tensor([0, 4, 3], dtype=torch.int32)), ValueError, "non-decreasing"),
    (dict(seq_lens=torch.tensor([1, 5], dtype=torch.int32)), ValueError, "this step's tokens"),
    (dict(seq_lens=torch.tensor([49, 5], dtype=torch.int32)), IndexError, "holds only 3 blocks"),
    (dict(seq_lens=torch.tensor([33, 5], dtype=torch.int32)), IndexError, r"block_tables\[0, 2\] = -1"),
    (dict(block_tables=torch.tensor([[0, 8, -1], [2, -1, -1]], dtype=torch.int32)), IndexError, "outside"),
    (dict(key_cache=[1, 2]), TypeError, "torch.Tensor"),
    (dict(block_tables=torch.zeros(0, 3, dtype=torch.int32), seq_lens=torch.zeros(0, dtype=torch.int32),
          query_start_loc=torch.zeros(1, dtype=torch.int32)), ValueError, "query has 3 rows"),
])
def test_paged_attention_misuse(override, exc, match):
    with pytest.raises(exc, match=match):
        call_attention(**override)


def test_cuda_tensor_gives_a_clear_error():
    meta = torch.empty(3, 4, 64, device="meta")
    with pytest.raises(ValueError, match="on the CPU"):
        call_attention(query=meta)
    if torch.cuda.is_available():  # pragma: no cover - CPU machines
        with pytest.raises(NotImplementedError, match="no CUDA kernels to run CUDA tensors"):
            call_attention(query=torch.randn(3, 4, 64, device="cuda"))


def test_cuda_message_without_a_gpu(monkeypatch):
    class FakeDevice:
        type = "cuda"

        def __str__(self):
            return "cuda:0"

    class FakeTensor(torch.Tensor):  # a CPU tensor that says it lives on a GPU
        @property
        def device(self):
            return FakeDevice()

        @property
        def is_cpu(self):
            return False

    q = torch.randn(3, 4, 64).as_subclass(FakeTensor)
    with pytest.raises(NotImplementedError, match="no CUDA kernels to run CUDA tensors"):
        call_attention(query=q)


def test_reshape_and_cache_misuse_writes_nothing():
    cache = torch.zeros(4, 2, 16, 64)
    vcache = torch.zeros_like(cache)
    key = torch.randn(3, 2, 64)
    with pytest.raises(IndexError, match="slot_mapping\\[2\\] = 64"):
        kernels.reshape_and_cache(key, key, cache, vcache, torch.tensor([0, 1, 64]))
    with pytest.raises(IndexError, match="use -1 for padding"):
        kernels.reshape_and_cache(key, key, cache, vcache, torch.tensor([0, -2, 1]))
    assert (cache == 0).all() and (vcache == 0).all()
    with pytest.raises(TypeError, match="int64"):
        kernels.reshape_and_cache(key, key, cache, vcache, torch.tensor([0, 1, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="heads"):
        kernels.reshape_and_cache(torch.randn(3, 3, 64), torch.randn(3, 3, 64), cache, vcache, torch.tensor([0, 1, 2]))
    with pytest.raises(TypeError, match="same dtype"):
        kernels.reshape_and_cache(key, key.bfloat16(), cache, vcache, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="3 tokens but value has 2"):
        kernels.reshape_and_cache(key, key[:2], cache, vcache, torch.tensor([0, 1, 2]))


def test_copy_and_swap_misuse():
    kv = torch.zeros(2, 2, 4, 1, 16, 8)
    with pytest.raises(IndexError, match="outside"):
        kernels.copy_blocks(kv, torch.tensor([[0, 4]], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"\[n, 2\]"):
        kernels.copy_blocks(kv, torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(TypeError, match="int32"):
        kernels.copy_blocks(kv, torch.tensor([[0.0, 1.0]]))
    with pytest.raises(ValueError, match="key, value"):
        kernels.copy_blocks(torch.zeros(2, 3, 4, 1, 16, 8), torch.tensor([[0, 1]], dtype=torch.int32))
    with pytest.raises(ValueError, match="only in num_blocks"):
        kernels.swap_blocks(kv, torch.zeros(2, 2, 4, 2, 16, 8), torch.tensor([[0, 1]], dtype=torch.int32))
    with pytest.raises(TypeError, match="same dtype"):
        kernels.swap_blocks(kv, kv.bfloat16(), torch.tensor([[0, 1]], dtype=torch.int32))
    with pytest.raises(ValueError, match="copy_blocks within one cache"):
        kernels.swap_blocks(kv, kv, torch.tensor([[0, 1]], dtype=torch.int32))
    with pytest.raises(IndexError, match="outside"):
        kernels.swap_blocks(kv, torch.zeros(2, 2, 9, 1, 16, 8), torch.tensor([[4, 0]], dtype=torch.int32))


def test_cuda_tensors_are_forwarded_to_attention_cuda_when_available(monkeypatch):
    from pagedcore.ops import attention_cuda

    class GpuTensor(torch.Tensor):  # a CPU tensor that says it lives on a GPU
        @property
        def is_cpu(self):
            return False

        @property
        def is_cuda(self):
            return True

    calls = []
    monkeypatch.setattr(attention_cuda, "is_available", lambda: True)
    for op in ("paged_attention", "reshape_and_cache", "copy_blocks", "swap_blocks"):
        monkeypatch.setattr(attention_cuda, op, lambda *a, _op=op: calls.append((_op, len(a))))
    a = attention_args()
    a["query"] = a["query"].as_subclass(GpuTensor)
    kernels.paged_attention(a.pop("out"), a.pop("query"), **a)
    key = torch.randn(3, 2, 64).as_subclass(GpuTensor)
    kernels.reshape_and_cache(key, key, torch.zeros(4, 2, 16, 64), torch.zeros(4, 2, 16, 64), torch.tensor([0, 1, 2]))
    kv = torch.zeros(2, 2, 4, 1, 16, 8).as_subclass(GpuTensor)
    kernels.copy_blocks(kv, torch.tensor([[0, 1]], dtype=torch.int32))
    kernels.swap_blocks(kv, torch.zeros(2, 2, 4, 1, 16, 8), torch.tensor([[0, 1]], dtype=torch.int32))
    assert calls == [("paged_attention", 10), ("reshape_and_cache", 5), ("copy_blocks", 2), ("swap_blocks", 3)]


def test_unsupported_layout_names_the_arguments():
    # head_size 1 with a non-unit last stride passes the shape checks but not the kernel's layout:
    # the error lists what was given instead of running anything.
    cache = torch.zeros(4, 2, 16, 1)
    key = torch.randn(3, 2, 5)[:, :, ::5]  # [3, 2, 1], strides (10, 5, 5)
    with pytest.raises(ValueError, match=r"does not support these arguments: key \(3, 2, 1\)"):
        kernels.reshape_and_cache(key, key, cache, cache.clone(), torch.tensor([0, 1, 2]))
