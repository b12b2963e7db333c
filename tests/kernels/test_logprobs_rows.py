"""The C++ logprobs of CPU rows (sampling/logprobs.py gather_logprobs, cpp/kernels/logprobs_rows.h)
against a float64 reference: ranks exact, top-K ids in (value desc, id asc) order exact, values
within float32 rounding of log_softmax; ties, -inf, NaN and all -inf rows; many rows (in parallel)
equal to one row at a time; the torch ops it stands in for agree; bad inputs refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedcore import _core
from pagedcore.sampling.logprobs import gather_logprobs


def reference(row: np.ndarray, token: int, k: int):
    """float64 (ids [k + 1], values [k + 1], rank) of one row by the kernel's definitions."""
    x = row.astype(np.float64)
    finite = x[~np.isnan(x)]
    peak = finite.max() if len(finite) else -np.inf
    with np.errstate(over="ignore", invalid="ignore"):
        log_normaliser = np.log(np.exp(finite - peak).sum()) + peak if np.isfinite(peak) else np.nan
    chosen = x[token]
    rank = int((x >= chosen).sum())
    order = sorted(range(len(x)), key=lambda i: (0 if np.isnan(x[i]) else 1, -x[i] if not np.isnan(x[i]) else 0, i))
    ids = [token] + order[:k]
    return np.array(ids), x[ids] - log_normaliser, rank


@st.composite
def rows(draw):
    vocab = draw(st.integers(1, 3000))
    k = draw(st.integers(0, min(20, vocab)))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(vocab) * draw(st.sampled_from([0.1, 3.0, 30.0]))).astype(np.float32)
    if draw(st.booleans()):
        x = np.round(x * 2) / 2  # many ties
    if draw(st.booleans()):
        x[rng.integers(0, vocab, size=max(1, vocab // 10))] = -np.inf
    token = int(rng.integers(0, vocab))
    return x, token, k


@settings(max_examples=150, deadline=None)
@given(rows())
def test_a_row_equals_the_float64_reference(case):
    x, token, k = case
    ids, values, ranks = gather_logprobs(torch.from_numpy(x.copy()).unsqueeze(0), torch.tensor([token]), k)
    ref_ids, ref_values, ref_rank = reference(x, token, k)
    assert ranks.tolist() == [ref_rank]
    assert ids[0].tolist() == ref_ids.tolist()
    got = values[0].double().numpy()
    finite = np.isfinite(ref_values)
    assert np.array_equal(np.isfinite(got), finite)
    # float32: the normaliser log(sum) + max carries max's rounding (~1.2e-7 |max|), as torch's does
    peak = np.abs(x[np.isfinite(x)]).max() if np.isfinite(x).any() else 0.0
    assert np.allclose(got[finite], ref_values[finite], rtol=2e-6, atol=2e-6 + 2.5e-7 * peak)
    assert (got[~finite] == ref_values[~finite]).all() or np.isnan(ref_values[~finite]).all()


def test_many_rows_equal_one_at_a_time_and_the_torch_ops(monkeypatch):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(9, 4099, generator=g) * 4  # [R, V]: a vocabulary that is no multiple of a block
    tokens = torch.randint(0, 4099, (9,), generator=g)
    ids, values, ranks = gather_logprobs(x.clone(), tokens, 7)
    for r in range(9):
        i, v, k = gather_logprobs(x[r:r + 1].clone(), tokens[r:r + 1], 7)
        assert torch.equal(i[0], ids[r]) and torch.equal(v[0], values[r]) and torch.equal(k[0], ranks[r])
    monkeypatch.setenv("PAGEDCORE_CPU_LOGPROBS", "0")
    t_ids, t_values, t_ranks = gather_logprobs(x.clone(), tokens, 7)
    assert torch.equal(t_ids, ids) and torch.equal(t_ranks, ranks)
    assert torch.allclose(t_values, values, rtol=0, atol=4e-6)  # both within ~1.3e-6 of float64 here


def test_special_rows():
    nan_row = torch.tensor([[0.0, float("nan"), 1.0, float("-inf")]])
    ids, values, ranks = gather_logprobs(nan_row.clone(), torch.tensor([1]), 2)
    assert ids.tolist() == [[1, 1, 2]]  # NaN counts as the largest for top-K
    assert ranks.tolist() == [0] and torch.isnan(values[0, 0])  # a NaN chosen value: rank 0, NaN logprob
    ids, values, ranks = gather_logprobs(nan_row.clone(), torch.tensor([3]), 0)
    assert ranks.tolist() == [3] and values[0, 0].item() == float("-inf")  # (NaN >= -inf is false)
    dead = torch.full((1, 5), float("-inf"))
    ids, values, ranks = gather_logprobs(dead.clone(), torch.tensor([2]), 1)
    assert ids.tolist() == [[2, 0]] and ranks.tolist() == [5] and torch.isnan(values).all()


def test_bad_inputs_are_refused():
    x = torch.randn(2, 10)
    with pytest.raises(IndexError, match="outside the vocabulary"):
        gather_logprobs(x.clone(), torch.tensor([0, 10]), 2)
    with pytest.raises(ValueError, match="top logprobs"):
        gather_logprobs(x.clone(), torch.tensor([0, 1]), 11)
    with pytest.raises(ValueError, match="token ids for 2 rows"):
        gather_logprobs(x.clone(), torch.tensor([0]), 1)
    with pytest.raises(ValueError, match="invalid sizes"):
        _core.logprobs_rows_cpu(x.data_ptr(), 2, 10, 9, 0, 1, 0, 0, 0)
