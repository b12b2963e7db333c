"""The dense linear dispatch: oneDNN with a prepacked weight (ops/onednn_linear.py) against a float64
F.linear oracle at several shapes and both dtypes; the per-ISA threshold table (ops/linear_dispatch.py)
consulted for each ISA, with its overrides; the dense layer packing at load and using the plan's
library above the kernel's rows; and the dispatch report naming every kernel family."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from pagedcore.layers.linear import DenseLinearMethod, Linear, MergedLinear
from pagedcore.ops import linear as linear_ops
from pagedcore.ops import linear_dispatch, linear_isa
from pagedcore.ops.onednn_linear import PrepackedWeight, available, unavailable_reason

needs_onednn_fp32 = pytest.mark.skipif(not available(torch.float32), reason="oneDNN prepacked linear unavailable: "
                                       f"{unavailable_reason(torch.float32)}")


def skip_without_onednn(dtype: torch.dtype) -> None:
    if not available(dtype):  # bf16: refused on CPUs without AVX-512 (an AVX2-only EPYC)
        pytest.skip(f"oneDNN prepacked linear unavailable: {unavailable_reason(dtype)}")

# (M, N, K): SmolLM2's shapes (qkv, o_proj, gate_up, down) at prefill-like rows, and odd sizes.
SHAPES = [(1, 960, 576), (17, 576, 576), (130, 3072, 576), (64, 576, 1536), (300, 53, 70), (5, 7, 3)]


def reference(x, w, b=None):
    return F.linear(x.double(), w.double(), None if b is None else b.double())  # [..., N] float64


def assert_close(got, want, x, w, dtype):
    # fp32: another summation order; bf16: products and sums in fp32, one rounding of the output.
    scale = (x.double().abs().reshape(-1, x.shape[-1]) @ w.double().abs().T).max().item() + 1.0
    if dtype is torch.bfloat16:
        torch.testing.assert_close(got.double(), want, atol=2e-5 * scale, rtol=1e-2)
    else:
        torch.testing.assert_close(got.double(), want, atol=2e-6 * scale, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M,N,K", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_prepacked_equals_f_linear(dtype, M, N, K, with_bias):
    skip_without_onednn(dtype)
    gen = torch.Generator().manual_seed(M * 7 + N + K)
    x = torch.randn(M, K, generator=gen).to(dtype)
    w = (torch.randn(N, K, generator=gen) * 0.1).to(dtype)
    b = torch.randn(N, generator=gen).to(dtype) if with_bias else None
    got = PrepackedWeight(w, b)(x)
    assert got.dtype is dtype and got.shape == (M, N)
    assert_close(got, reference(x, w, b), x, w, dtype)
    # And the same as torch's own GEMM on these operands, to the same tolerance.
    assert_close(got, F.linear(x, w, b).double(), x, w, dtype)


@needs_onednn_fp32
def test_prepacked_takes_leading_dims_and_strided_rows():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(40, 24, generator=gen)
    packed = PrepackedWeight(w)
    x3 = torch.randn(2, 5, 24, generator=gen)
    assert_close(packed(x3), reference(x3, w), x3, w, torch.float32)
    strided = torch.randn(9, 48, generator=gen)[:, :24]  # rows 48 apart
    assert_close(packed(strided), reference(strided, w), strided, w, torch.float32)
    with pytest.raises(ValueError, match="cast x"):
        packed(x3.bfloat16())
    assert packed.matches(w) and not packed.matches(w.clone())


@pytest.mark.parametrize("isa,flags,fp32,bf16", [
    ("avx2", set(), (128, "torch"), (256, "widen")),
    ("generic", set(), (128, "torch"), (256, "widen")),
    ("avx512", {"avx512f"}, (128, "torch"), (256, "widen")),
    ("avx512_bf16", {"avx512f", "avx512_bf16"}, None, None),
    ("avx512_bf16", {"avx512f", "avx512_bf16", "amx_bf16"}, None, None),
])
def test_threshold_table_is_consulted_per_isa(monkeypatch, isa, flags, fp32, bf16):
    for name in ("PAGEDCORE_LINEAR_MAX_ROWS", "PAGEDCORE_LINEAR_LIBRARY", "PAGEDCORE_WIDEN_BF16_GEMM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(linear_dispatch, "auto_isa", lambda: isa)
    monkeypatch.setattr(linear_dispatch, "cpu_flags", lambda: frozenset(flags))
    row_name = "amx_bf16" if "amx_bf16" in flags else {"generic": "avx2"}.get(isa, isa)
    assert linear_dispatch.gemm_isa() == row_name
    row = linear_dispatch.GEMM_PLANS[row_name]
    for dtype, expected in ((torch.float32, fp32), (torch.bfloat16, bf16)):
        plan = linear_dispatch.gemm_plan(dtype)
        if available(dtype) or row[dtype].library != "onednn_packed":
            assert plan == row[dtype]
        else:  # a CPU without oneDNN's packed path (an AVX2-only one posing as this row): the fallback
            assert plan.kernel_max_rows == row[dtype].kernel_max_rows and plan.library in ("torch", "widen")
        if expected is not None:  # the AVX2 values stay what the AVX2 machine measured
            assert (plan.kernel_max_rows, plan.library) == expected
        assert linear_ops.max_rows(dtype) == plan.kernel_max_rows  # the layers and the stack read it
    assert linear_ops._slow_bf16_gemm() == (linear_dispatch.gemm_plan(torch.bfloat16).library == "widen")


def test_a_dtype_onednn_refuses_falls_back_alone(monkeypatch):
    """oneDNN refuses bf16 without AVX-512 (an AVX2-only EPYC) but runs fp32 there: the refusal is per
    dtype, so a bf16 weight falls back to the plan's other library and fp32 keeps the packed path."""
    for name in ("PAGEDCORE_LINEAR_MAX_ROWS", "PAGEDCORE_LINEAR_LIBRARY", "PAGEDCORE_WIDEN_BF16_GEMM"):
        monkeypatch.delenv(name, raising=False)
    from pagedcore.ops import onednn_linear

    def no_bf16(dtype=None):
        return "" if dtype is torch.float32 else "mkldnn linear failed for bf16: needs avx512bw"
    monkeypatch.setattr(onednn_linear, "unavailable_reason", no_bf16)
    linear_dispatch._library_ok.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="needs avx512bw"):
            PrepackedWeight(torch.ones(8, 16, dtype=torch.bfloat16))
        row = linear_dispatch.GEMM_PLANS["avx512_bf16"]
        monkeypatch.setattr(linear_dispatch, "auto_isa", lambda: "avx512_bf16")
        monkeypatch.setattr(linear_dispatch, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
        assert row[torch.float32].library == "onednn_packed"
        assert linear_dispatch.gemm_plan(torch.float32) == row[torch.float32]
        bf16 = linear_dispatch.gemm_plan(torch.bfloat16)
        assert bf16.kernel_max_rows == row[torch.bfloat16].kernel_max_rows
        assert bf16.library == row[torch.bfloat16].library != "onednn_packed"  # torch: no fallback needed
        monkeypatch.setenv("PAGEDCORE_LINEAR_LIBRARY", "onednn_packed")
        assert linear_dispatch.gemm_plan(torch.bfloat16).library == "torch"   # asked for, refused: falls back
        assert linear_dispatch.gemm_plan(torch.float32).library == "onednn_packed"
    finally:
        linear_dispatch._library_ok.cache_clear()


def test_every_row_of_the_table_is_complete():
    for isa, row in linear_dispatch.GEMM_PLANS.items():
        assert set(row) == {torch.float32, torch.bfloat16}, isa
        for plan in row.values():
            assert plan.library in linear_dispatch.LIBRARIES and plan.kernel_max_rows >= 0 and plan.measured
    # Every kernel ISA has a row, its own or a borrowed one.
    for isa in linear_isa.ISA_CODES:
        if isa != "auto":
            assert isa in linear_dispatch.GEMM_PLANS or isa in linear_dispatch._FALLBACK or isa.startswith("amx")


def test_overrides(monkeypatch):
    monkeypatch.setenv("PAGEDCORE_LINEAR_MAX_ROWS", "7")
    monkeypatch.setenv("PAGEDCORE_LINEAR_LIBRARY", "torch")
    plan = linear_dispatch.gemm_plan(torch.bfloat16)
    assert (plan.kernel_max_rows, plan.library) == (7, "torch") and linear_ops.max_rows(torch.float32) == 7
    monkeypatch.setenv("PAGEDCORE_LINEAR_LIBRARY", "widen")
    assert linear_dispatch.gemm_plan(torch.float32).library == "torch"  # nothing to widen in fp32
    monkeypatch.setenv("PAGEDCORE_LINEAR_LIBRARY", "mkl")
    with pytest.raises(ValueError, match="PAGEDCORE_LINEAR_LIBRARY"):
        linear_dispatch.gemm_plan(torch.float32)
    monkeypatch.delenv("PAGEDCORE_LINEAR_LIBRARY")
    monkeypatch.setenv("PAGEDCORE_LINEAR_MAX_ROWS", "many")
    with pytest.raises(ValueError, match="not an integer"):
        linear_dispatch.gemm_plan(torch.float32)


def _loaded_layer(dtype, merged: bool, gen):
    """A dense layer filled through its method's load(), as the model loader does."""
    method = DenseLinearMethod(str(dtype).split(".")[1], dtype)
    if merged:
        layer = MergedLinear(96, {"gate": 80, "up": 80}, bias=False, method=method)
        parts = {shard: torch.randn(80, 96, generator=gen) * 0.1 for shard in ("gate", "up")}
        for shard, w in parts.items():
            assert layer._library.packed is None  # not before the last rows are in
            layer.load_shard(shard, "weight", w, f"{shard}.weight")
        full = torch.cat([parts["gate"], parts["up"]]).to(dtype)
    else:
        layer = Linear(96, 72, bias=True, method=method)
        full = (torch.randn(72, 96, generator=gen) * 0.1).to(dtype)
        layer.load_weight("weight", full, "w")
        layer.load_weight("bias", torch.randn(72, generator=gen), "b")
    return layer, full


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("library", ["onednn_packed", "torch", "widen"])
def test_dense_layer_uses_the_plans_library_above_the_kernel_rows(monkeypatch, dtype, library):
    if library == "onednn_packed":
        skip_without_onednn(dtype)
    monkeypatch.setenv("PAGEDCORE_LINEAR_MAX_ROWS", "16")
    monkeypatch.setenv("PAGEDCORE_LINEAR_LIBRARY", library)
    gen = torch.Generator().manual_seed(1)
    for merged in (False, True):
        layer, w = _loaded_layer(dtype, merged, gen)
        packed = layer._library.packed
        assert (packed is not None) == (library == "onednn_packed")  # packed at load, once
        b = None if merged else layer.bias
        for rows in (3, 16, 17, 200):  # both sides of the threshold
            x = torch.randn(rows, 96, generator=gen).to(dtype)
            y = layer(x)
            assert y.dtype is dtype and y.shape == (rows, w.shape[0])
            assert_close(y, reference(x, w, b), x, w, dtype)
            if merged:
                half = w.shape[0] // 2
                want = reference(x, w)
                want = F.silu(want[:, :half].to(dtype).double()) * want[:, half:].to(dtype).double()
                got = layer.forward_silu_mul(x)
                torch.testing.assert_close(got.double(), want, atol=0.05 if dtype is torch.bfloat16 else 1e-4,
                                           rtol=2e-2 if dtype is torch.bfloat16 else 1e-4)
        assert layer._library.packed is packed  # calls reuse the packed weight
        if library == "onednn_packed":
            layer.weight = torch.nn.Parameter(layer.weight.detach().clone(), requires_grad=False)  # moved
            x = torch.randn(40, 96, generator=gen).to(dtype)
            assert_close(layer(x), reference(x, w, b), x, w, dtype)
            assert layer._library.packed is not packed and layer._library.packed.matches(layer.weight)


def test_dispatch_report_lists_every_family(caplog):
    report = dict(linear_isa.dispatch_report())
    for family in ("cpu", "attention", "dense linear kernel", "norms + rotary", "quantized linear",
                   "dense fp32 GEMM plan", "dense bf16 GEMM plan", "dense fp16 GEMM plan", "16-bit weights, fp32 x",
                   "library GEMM ISA", "kernel threads"):
        assert report.get(family), family
    from pagedcore import _core

    assert report["kernel threads"].startswith(_core.kernel_threading() + " now")
    isa = linear_isa.auto_isa()
    assert isa in report["cpu"] and isa in report["dense linear kernel"]
    # Attention's pair-dot tiles (attention_dot_tiles.h) run where the kernel ISA has bf16 pair dots.
    assert ("vdpbf16ps pair dot products" in report["attention"]) == (isa in ("avx512_bf16", "generic16_bf16"))
    from pagedcore.ops.dense_repack import dense_repack_enabled

    for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        if dense_repack_enabled(dtype):   # x16 layers run our kernel at every row count
            assert f"{name}x16 repacked at load" in report[f"dense {name} GEMM plan"]
            continue
        plan = linear_dispatch.gemm_plan(dtype)
        assert f"up to {plan.kernel_max_rows} rows" in report[f"dense {name} GEMM plan"]
        assert plan.library in report[f"dense {name} GEMM plan"]
    logger = logging.getLogger("test_dispatch")
    linear_isa._logged = False
    with caplog.at_level(logging.INFO, logger="test_dispatch"):
        linear_isa.log_dispatch(logger)
        linear_isa.log_dispatch(logger)  # once per process
    lines = [r.getMessage() for r in caplog.records if r.name == "test_dispatch"]
    assert len(lines) == len(report) and all(line.startswith("kernel dispatch:") for line in lines)
