"""The fused elementwise ops of pagedcore.ops.elementwise against the unfused torch ops they replace
in the model layers: residual add + RMSNorm (HF Llama's rounding order) and the rotary embedding on
strided q/k views of a fused qkv output; every kernel variant this CPU runs; misuse raises."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedcore.ops import elementwise
from pagedcore.ops.linear_isa import supported_isas

ISAS = supported_isas()
DTYPES = [torch.float32, torch.bfloat16]


def torch_rms_norm(x, weight, eps):
    """layers.layernorm.RMSNorm's torch path (HF: normalise in fp32, cast, times weight)."""
    return F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype).mul_(weight)


def torch_rotary(x, cos_sin):
    """layers.rotary_embedding's torch path, in place."""
    half = x.shape[-1] // 2
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]
    x1, x2 = x[..., :half], x[..., half:]
    x1_sin = x1 * sin
    new_x1 = (x1 * cos).sub_(x2 * sin)
    x2.mul_(cos).add_(x1_sin)
    x1.copy_(new_x1)


def assert_norm_close(got, want):
    if got.dtype == torch.bfloat16:
        # Only the mean of squares is summed in another order: at most one bf16 step apart, and
        # almost everywhere equal.
        diff = (got.float() - want.float()).abs()
        assert (diff <= want.float().abs() * 2 ** -7 + 1e-30).all()
        assert (diff == 0).float().mean() > 0.97
    else:
        torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [576, 100, 7])
def test_rms_norm_matches_torch(isa, dtype, n):
    gen = torch.Generator().manual_seed(n)
    x = (torch.randn(33, n, generator=gen) * 3).to(dtype)
    w = (1 + 0.2 * torch.randn(n, generator=gen)).to(dtype)
    assert_norm_close(elementwise.rms_norm(x, w, 1e-5, isa=isa), torch_rms_norm(x, w, 1e-5))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_matches_torch(isa, dtype):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(17, 576, generator=gen).to(dtype)
    residual = (torch.randn(17, 576, generator=gen) * 4).to(dtype)
    w = (1 + 0.2 * torch.randn(576, generator=gen)).to(dtype)
    want_residual = residual.clone().add_(x)
    want = torch_rms_norm(want_residual, w, 1e-6)
    got = elementwise.rms_norm(x, w, 1e-6, residual, isa=isa)
    assert torch.equal(residual, want_residual)  # the add is the same single rounding as torch's
    assert_norm_close(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_strided_rows_in_place_and_many_rows(dtype):
    gen = torch.Generator().manual_seed(2)
    wide = torch.randn(400, 80, generator=gen).to(dtype)
    x = wide[:, 8:72]  # rows 80 apart
    w = torch.randn(64, generator=gen).to(dtype)
    want = torch_rms_norm(x.contiguous(), w, 1e-6)
    assert_norm_close(elementwise.rms_norm(x, w, 1e-6), want)
    y = x.contiguous()
    elementwise.rms_norm(y, w, 1e-6, out=y)  # in place
    assert_norm_close(y, want)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 32, 10])
def test_rotary_on_qk_view_is_bit_identical_to_torch(isa, dtype, head_dim):
    gen = torch.Generator().manual_seed(head_dim)
    T, H, Hkv = 9, 6, 2
    qkv = torch.randn(T, (H + 2 * Hkv) * head_dim, generator=gen).to(dtype)
    angles = torch.rand(T, head_dim // 2, generator=gen) * 100
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1).to(dtype)  # [T, head_dim]
    want = qkv.clone()
    torch_rotary(want[:, :(H + Hkv) * head_dim].view(T, H + Hkv, head_dim), cos_sin)
    got = qkv.clone()
    elementwise.rotary_embedding(got[:, :(H + Hkv) * head_dim].view(T, H + Hkv, head_dim), cos_sin, isa=isa)
    assert torch.equal(got, want)  # v untouched, q and k rotated with torch's roundings


def test_rotary_with_rows_of_a_larger_cache():
    gen = torch.Generator().manual_seed(4)
    cache = torch.randn(50, 64, generator=gen)
    positions = torch.tensor([3, 17, 17, 40])
    cos_sin = cache.index_select(0, positions)
    x = torch.randn(4, 3, 64, generator=gen)
    want = x.clone()
    torch_rotary(want, cos_sin)
    elementwise.rotary_embedding(x, cos_sin)
    assert torch.equal(x, want)


@pytest.mark.parametrize("call,exc,match", [
    (lambda: elementwise.rms_norm(torch.randn(2, 8), torch.randn(7), 1e-6), ValueError, r"shape \(8,\)"),
    (lambda: elementwise.rms_norm(torch.randn(2, 8), torch.randn(8).bfloat16(), 1e-6), TypeError, "one dtype"),
    (lambda: elementwise.rms_norm(torch.randn(2, 8).double(), torch.randn(8).double(), 1e-6), TypeError,
     "float32"),
    (lambda: elementwise.rms_norm(torch.randn(8, 2).T, torch.randn(8), 1e-6), ValueError, "unit stride"),
    (lambda: elementwise.rms_norm(torch.randn(2, 3, 8), torch.randn(8), 1e-6), ValueError, "2-D"),
    (lambda: elementwise.rms_norm(torch.randn(2, 8), torch.randn(8), 1e-6, torch.randn(3, 8)), ValueError,
     "like x"),
    (lambda: elementwise.rotary_embedding(torch.randn(2, 3, 8), torch.randn(2, 6)), ValueError, "head_dim"),
    (lambda: elementwise.rotary_embedding(torch.randn(2, 3, 8), torch.randn(2, 8).bfloat16()), TypeError,
     "one dtype"),
    (lambda: elementwise.rotary_embedding(torch.randn(2, 8, 3).transpose(1, 2), torch.randn(2, 8)),
     ValueError, "unit stride"),
    (lambda: elementwise.rotary_embedding(torch.randn(2, 3, 7), torch.randn(2, 7)), ValueError, "even"),
])
def test_misuse_raises_with_the_fix(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
