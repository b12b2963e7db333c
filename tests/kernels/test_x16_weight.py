"""X16Weight (ops/dense_repack.py): a repacked dense weight's one copy. It must read as W [N, K] to
every torch op and to module.to(), hold only the x16 bytes, keep in-place writes, and fail loudly
where no [N, K] memory exists (data_ptr)."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pagedcore.ops.dense_repack import X16Weight, pack_x16, unpack_x16

DTYPES = [torch.float32, torch.bfloat16]


def _weight(dtype, N=48, K=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(N, K, generator=gen).to(dtype)  # [N, K]


@pytest.mark.parametrize("dtype", DTYPES)
def test_reads_as_w_and_holds_only_the_x16_bytes(dtype):
    W = _weight(dtype)
    p = nn.Parameter(X16Weight.of(W), requires_grad=False)
    assert isinstance(p, nn.Parameter) and type(p) is X16Weight and not p.requires_grad
    assert p.shape == W.shape and p.dtype is dtype and p.is_cpu and p.nbytes == W.nbytes
    assert torch.equal(p.packed, pack_x16(W)) and p.packed.nbytes == W.nbytes  # the only bytes
    assert p.held_data_ptr() == p.packed.data_ptr()
    x = _weight(dtype, 5, 40, seed=1)
    assert torch.equal(F.linear(x, p), F.linear(x, W))
    assert torch.equal(p, W) and torch.equal(p.data, W) and torch.equal(p.t(), W.t())
    assert torch.equal(p[3], W[3]) and torch.equal(p[:, 7:9], W[:, 7:9])
    clone = p.clone()
    assert type(clone) is torch.Tensor and torch.equal(clone, W)
    assert type(p.data) is X16Weight and p.data.packed is p.packed  # .data shares the bytes
    with pytest.raises(RuntimeError, match="x16 layout"):
        p.data_ptr()  # no [N, K] memory: loud, not a pointer to the other layout


@pytest.mark.parametrize("dtype", DTYPES)
def test_in_place_writes_land_in_the_packed_bytes(dtype):
    W, W2 = _weight(dtype), _weight(dtype, seed=2)
    p = nn.Parameter(X16Weight.of(W), requires_grad=False)
    ptr = p.packed.data_ptr()
    assert p.copy_(W2) is p
    assert torch.equal(p, W2) and p.packed.data_ptr() == ptr and torch.equal(unpack_x16(p.packed), W2)
    p.mul_(2)
    assert torch.equal(p, W2 * 2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_assigning_data_aliases_the_new_tensor(dtype):
    W, W2 = _weight(dtype), _weight(dtype, seed=3).t()  # another shape, not contiguous
    p = nn.Parameter(X16Weight.of(W), requires_grad=False)
    p.data = W2
    assert p.packed is None and p.plain is W2
    assert p.shape == W2.shape and not p.is_contiguous() and p.data_ptr() == W2.data_ptr()
    assert torch.equal(p, W2)
    p.add_(1)  # the alias is written, as a plain parameter's would be
    assert torch.equal(W2, _weight(dtype, seed=3).t() + 1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_module_moves_get_w(dtype):
    W = _weight(dtype)
    layer = nn.Linear(40, 48, bias=False)
    layer.weight = nn.Parameter(X16Weight.of(W), requires_grad=False)
    layer.to("cpu")  # nothing to do: still held packed
    assert type(layer.weight) is X16Weight and layer.weight.packed is not None
    layer.to(torch.float64)  # another dtype: W converted
    assert layer.weight.dtype is torch.float64 and torch.equal(layer.weight, W.double())
    layer.weight = nn.Parameter(X16Weight.of(W), requires_grad=False)
    layer.to("meta")  # another device (as a GPU move): W in the checkpoint layout there
    assert layer.weight.device.type == "meta" and layer.weight.shape == W.shape
    assert not (type(layer.weight) is X16Weight and layer.weight.packed is not None)


@pytest.mark.parametrize("dtype", DTYPES)
def test_deepcopy_and_pickle_keep_w_and_parameter(dtype):
    W = _weight(dtype)
    p = nn.Parameter(X16Weight.of(W), requires_grad=False)
    for other in (copy.deepcopy(p), pickle.loads(pickle.dumps(p))):
        assert type(other) is X16Weight and isinstance(other, nn.Parameter)
        assert torch.equal(other, W) and other.packed.data_ptr() != p.packed.data_ptr()
