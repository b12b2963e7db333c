"""The C++ greedy argmax (ops/argmax.py, cpp/kernels/argmax_rows.h) against torch.argmax(dim=-1):
the first index of the maximum, NaN counted largest, -0.0 == +0.0, on random rows with ties,
infinities and NaNs, strided rows, every vocab size's code path and the parallel batch branch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedcore import _core
from pagedcore.ops.argmax import argmax_rows, argmax_rows_tensor

SPECIALS = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.0, -1.0, 3.4e38, -3.4e38, 1e-45]


def _torch(logits: torch.Tensor) -> np.ndarray:
    return logits.argmax(dim=-1).numpy()


@settings(max_examples=300, deadline=None)
@given(rows=st.integers(1, 5), vocab=st.integers(1, 100),
       cells=st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(SPECIALS)), max_size=12),
       seed=st.integers(0, 2**31 - 1), coarse=st.booleans())
def test_equals_torch_on_random_rows(rows, vocab, cells, seed, coarse):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen)
    if coarse:  # few distinct values: ties everywhere
        logits = logits.mul(2).round()
    for index, value in cells:
        logits.view(-1)[index % logits.numel()] = value
    assert np.array_equal(argmax_rows(logits), _torch(logits))


@pytest.mark.parametrize("vocab", [1, 15, 16, 31, 32, 33, 49152, 49153])
def test_every_length_path(vocab):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(3, vocab, generator=gen)
    got = argmax_rows(logits)
    assert got.dtype == np.int64 and np.array_equal(got, _torch(logits))
    # the maximum at the very end, in the scalar tail, and a NaN after a larger prefix
    logits[0, -1] = 100.0
    logits[1, vocab // 2] = float("nan")
    logits[2].fill_(float("-inf"))
    assert np.array_equal(argmax_rows(logits), _torch(logits))


def test_strided_rows_and_fallbacks():
    base = torch.randn(6, 200)
    view = base[::2, 10:150]  # rows 400 floats apart, 140 wide
    assert np.array_equal(argmax_rows(view), _torch(view))
    assert np.array_equal(argmax_rows(base.t()), _torch(base.t()))  # inner stride != 1: torch's path
    assert np.array_equal(argmax_rows(base.to(torch.bfloat16)), _torch(base.to(torch.bfloat16)))
    assert torch.equal(argmax_rows_tensor(base), base.argmax(dim=-1))
    assert argmax_rows(torch.empty(0, 7)).shape == (0,)


def test_batch_runs_in_parallel_tasks_and_agrees():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(700, 1024, generator=gen).mul(4).round()  # > one task's 256 rows; ties
    assert np.array_equal(argmax_rows(logits), _torch(logits))


def test_raw_entry_refuses_bad_sizes():
    out = np.empty(1, dtype=np.int64)
    x = torch.zeros(1, 4)
    with pytest.raises(ValueError, match="invalid sizes"):
        _core.argmax_rows_cpu(x.data_ptr(), 1, 4, 3, out.ctypes.data)
    with pytest.raises(ValueError, match="invalid sizes"):
        _core.argmax_rows_cpu(x.data_ptr(), 1, 0, 4, out.ctypes.data)
