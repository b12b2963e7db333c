"""pagedcore.ops.linear against torch.nn.functional.linear: random shapes (M 1..32, K and N not
multiples of the vector width), with and without bias, fp32 and bf16, strided rows, the SwiGLU
epilogue, every kernel variant this CPU runs; misuse raises with the fix in the message."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedcore.ops import linear as linear_ops
from pagedcore.ops.linear_isa import ISA_CODES, supported_isas

ISAS = supported_isas()


def reference(x, weight, bias=None, silu_mul=False):
    """The same computation in torch, fp64, then rounded as torch rounds each op in x's dtype."""
    y = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    if not silu_mul:
        return y
    half = y.shape[-1] // 2
    g, u = y[..., :half], y[..., half:]
    if x.dtype == torch.bfloat16:  # torch in bf16: g, u rounded, silu rounded, product rounded
        g, u = g.to(torch.bfloat16), u.to(torch.bfloat16)
        return (F.silu(g) * u).double()
    return F.silu(g) * u


def assert_close(got, want, x, weight, dtype):
    # fp32: a different summation order; bf16 out: one rounding of the result (+ order).
    scale = (x.double().abs() @ weight.double().abs().T).max().item() + 1.0
    if dtype == torch.bfloat16:
        torch.testing.assert_close(got.double(), want.double(), atol=2e-5 * scale, rtol=1e-2)
    else:
        torch.testing.assert_close(got.double(), want.double(), atol=2e-6 * scale, rtol=1e-5)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_random_shapes_match_torch(isa, dtype):
    gen = torch.Generator().manual_seed(10 * ISAS.index(isa) + (dtype == torch.bfloat16))
    for trial in range(12):
        M = int(torch.randint(1, 33, (1,), generator=gen))
        K = int(torch.randint(1, 300, (1,), generator=gen))
        N = int(torch.randint(1, 200, (1,), generator=gen))
        x = torch.randn(M, K, generator=gen).to(dtype)
        w = (torch.randn(N, K, generator=gen) / K ** 0.5).to(dtype)
        b = torch.randn(N, generator=gen).to(dtype) if trial % 2 else None
        got = linear_ops.linear(x, w, b, isa=isa)
        assert got.shape == (M, N) and got.dtype == dtype
        assert_close(got, reference(x, w, b), x, w, dtype)


@pytest.mark.parametrize("isa", ISAS)
def test_model_shapes_and_fp32_logits_from_bf16(isa):
    gen = torch.Generator().manual_seed(3)
    for M, N, K in [(1, 960, 576), (4, 3072, 576), (16, 576, 1536), (1, 4099, 576)]:
        x = torch.randn(M, K, generator=gen)
        w = torch.randn(N, K, generator=gen) / K ** 0.5
        assert_close(linear_ops.linear(x, w, isa=isa), reference(x, w), x, w, torch.float32)
        xb, wb = x.bfloat16(), w.bfloat16()
        logits = linear_ops.linear(xb, wb, out_dtype=torch.float32, isa=isa)  # the LM head's call
        assert logits.dtype == torch.float32
        assert_close(logits, reference(xb, wb), xb, wb, torch.float32)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_silu_mul_epilogue_matches_unfused(isa, dtype, bias):
    gen = torch.Generator().manual_seed(5)
    for M, I, K in [(1, 48, 64), (3, 37, 50), (9, 128, 96)]:
        x = torch.randn(M, K, generator=gen).to(dtype)
        w = (torch.randn(2 * I, K, generator=gen) / K ** 0.5).to(dtype)
        b = torch.randn(2 * I, generator=gen).to(dtype) if bias else None
        got = linear_ops.linear(x, w, b, silu_mul=True, isa=isa)
        assert got.shape == (M, I)
        assert_close(got, reference(x, w, b, silu_mul=True), x, w, dtype)
        # the unfused torch path the layer replaces
        unfused = F.linear(x, w, b)
        unfused = F.silu(unfused[:, :I]) * unfused[:, I:]
        assert_close(got, unfused, x, w, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_rows_and_leading_dims(dtype):
    gen = torch.Generator().manual_seed(7)
    wide = torch.randn(6, 100, generator=gen).to(dtype)
    x = wide[:, 10:74]  # rows 100 apart, last stride 1
    w = torch.randn(30, 64, generator=gen).to(dtype)
    assert_close(linear_ops.linear(x, w), reference(x, w), x, w, dtype)
    x3 = torch.randn(2, 3, 64, generator=gen).to(dtype)
    got = linear_ops.linear(x3, w)
    assert got.shape == (2, 3, 30)
    assert_close(got.reshape(6, 30), reference(x3.reshape(6, 64), w), x3.reshape(6, 64), w, dtype)


def test_many_tasks_and_large_m_match_torch():
    gen = torch.Generator().manual_seed(11)
    from pagedcore import _core
    try:
        _core.set_linear_tuning(8, 12)
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(45, 70, generator=gen).to(dtype)
            w = torch.randn(53, 70, generator=gen).to(dtype)
            b = torch.randn(53, generator=gen).to(dtype)
            assert_close(linear_ops.linear(x, w, b), reference(x, w, b), x, w, dtype)
    finally:
        _core.set_linear_tuning()
    x = torch.randn(300, 576, generator=gen).bfloat16()
    w = torch.randn(200, 576, generator=gen).bfloat16()
    assert_close(linear_ops.linear(x, w), reference(x, w), x, w, torch.bfloat16)


@pytest.mark.parametrize("widen", ["0", "1"])
def test_torch_linear_bf16_widened_or_not_matches_the_reference(monkeypatch, widen):
    # Calls past max_rows go to torch_linear; on CPUs with a slow bf16 GEMM it widens bf16 to fp32
    # for the call and rounds once. Both routes must give torch's bf16 GEMM result: the exact
    # product rounded once to bf16, up to summation order.
    monkeypatch.setenv("PAGEDCORE_WIDEN_BF16_GEMM", widen)
    linear_ops._slow_bf16_gemm.cache_clear()
    try:
        gen = torch.Generator().manual_seed(5)
        x = torch.randn(300, 96, generator=gen).bfloat16()
        w = torch.randn(130, 96, generator=gen).bfloat16()
        b = torch.randn(130, generator=gen).bfloat16()
        got = linear_ops.torch_linear(x, w, b)
        assert got.dtype == torch.bfloat16 and got.shape == (300, 130)
        assert_close(got, reference(x, w, b), x, w, torch.bfloat16)
        if widen == "1":  # bit-exact with the widened computation it stands for
            assert torch.equal(got, F.linear(x.float(), w.float(), b.float()).bfloat16())
        xf, wf = x.float(), w.float()
        assert torch.equal(linear_ops.torch_linear(xf, wf, None), F.linear(xf, wf))  # fp32: torch as is
    finally:
        linear_ops._slow_bf16_gemm.cache_clear()


def test_zero_rows_and_empty():
    w = torch.randn(8, 16)
    assert linear_ops.linear(torch.empty(0, 16), w).shape == (0, 8)
    assert linear_ops.linear(torch.empty(3, 0), torch.empty(8, 0)).eq(0).all()


def test_layer_kernel_rebinds_after_weight_moves():
    w = torch.randn(8, 16)
    kernel = linear_ops.LinearKernel(w)
    assert kernel.matches(w)
    assert not kernel.matches(w.clone())


@pytest.mark.parametrize("call,exc,match", [
    (lambda: linear_ops.linear(torch.randn(2, 8, dtype=torch.float64), torch.randn(4, 8)), TypeError, "float32"),
    (lambda: linear_ops.linear(torch.randn(2, 8), torch.randn(4, 8, dtype=torch.float64)), TypeError, "float16 weights"),
    (lambda: linear_ops.linear(torch.randn(2, 7), torch.randn(4, 8)), ValueError, "input features"),
    (lambda: linear_ops.linear(torch.randn(2, 8), torch.randn(8, 4).T), ValueError, "contiguous"),
    (lambda: linear_ops.linear(torch.randn(8, 2).T, torch.randn(4, 8)), ValueError, "unit stride"),
    (lambda: linear_ops.linear(torch.randn(2, 8), torch.randn(4, 8), torch.randn(5)), ValueError, r"\(4,\)"),
    (lambda: linear_ops.linear(torch.randn(2, 8), torch.randn(5, 8), silu_mul=True), ValueError, "even"),
    (lambda: linear_ops.linear(torch.randn(2, 8), torch.randn(4)), ValueError, "out_features, in_features"),
    (lambda: linear_ops.linear([1.0], torch.randn(4, 8)), TypeError, "torch.Tensor"),
    (lambda: linear_ops.linear(torch.randn(2, 8), torch.randn(4, 8), isa="sse9"), ValueError, "unknown ISA"),
    (lambda: linear_ops.LinearKernel(torch.randn(4, 8))(torch.randn(2, 8).bfloat16()), TypeError, "dtype"),
    (lambda: linear_ops.LinearKernel(torch.randn(4, 8))(torch.randn(2, 3, 8)), ValueError, "reshape"),
    (lambda: linear_ops.LinearKernel(torch.randn(4, 8))("x"), TypeError, "torch.Tensor"),
])
def test_misuse_raises_with_the_fix(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_unsupported_isa_is_refused():
    missing = [name for name in ISA_CODES if name != "auto" and name not in ISAS]
    for name in missing:
        with pytest.raises(ValueError, match="cannot run"):
            linear_ops.linear(torch.randn(2, 8), torch.randn(4, 8), isa=name)


def test_out_never_aliases_inputs_in_the_c_layer():
    from pagedcore import _core
    x, w = torch.randn(2, 8), torch.randn(4, 8)
    handle = _core.LinearHandle(weight=w.data_ptr(), bias=0, N=4, K=8, x_dtype=0,
                                weight_format=_core.WeightFormat.DENSE_F32, bias_dtype=0, out_dtype=0, epilogue=0)
    with pytest.raises(ValueError, match="overlaps"):
        handle(x.data_ptr(), x.data_ptr(), 2, 8, 4)
    with pytest.raises(ValueError, match="x_stride"):
        handle(torch.empty(2, 4).data_ptr(), x.data_ptr(), 2, 3, 4)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_does_not_depend_on_the_rows_beside_it(isa, dtype):
    """Row r of an M-row call equals the same row computed alone, bit for bit, for every M: the
    kernel's tiles sum each dot product in one order whatever the tile shape (a 5-row speculative
    verification must give the 1-row decode's logits, or greedy speculation drifts at near ties)."""
    torch.manual_seed(0)
    w = torch.randn(300, 200).to(dtype)  # N not a multiple of any tile; K with a tail
    x = torch.randn(9, 200).to(dtype)
    kernel = linear_ops.LinearKernel(w, out_dtype=torch.float32, isa=isa)
    alone = torch.cat([kernel(x[r:r + 1].contiguous()) for r in range(9)])  # [9, 300]
    for M in range(2, 10):
        assert torch.equal(kernel(x[:M].contiguous()), alone[:M]), f"{M} rows"
