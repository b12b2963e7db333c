"""The dense x16 layouts (ops/dense_repack.py, cpp/kernels/dense_x16_impl.h) against a torch fp64
reference on every kernel variant this CPU runs: M = 1 .. 130, bias, the SwiGLU epilogue, fp32 and
bf16 activations on bf16 weights, fp16 weights (both layouts) bit for bit as their fp32 copy; repack/unpack lossless; a row never depends on the rows beside it
(or on the task split); shapes the layout cannot hold are refused with the fix."""

from __future__ import annotations

import pytest
import torch

from pagedcore import _core
from pagedcore.ops import linear as linear_ops
from pagedcore.ops.dense_repack import pack_x16, packed_shape, unpack_x16, x16_problem
from pagedcore.ops.linear_isa import supported_isas

from tests.kernels.test_linear import assert_close, reference

ISAS = supported_isas()
ROWS = (1, 3, 8, 17, 64, 130)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_repack_is_lossless_and_has_the_documented_layout(dtype):
    w = torch.randn(48, 10).to(dtype)
    p = pack_x16(w)
    assert p.shape == packed_shape(48, 10, dtype) and p.is_contiguous()
    assert torch.equal(unpack_x16(p), w)
    # One element by the layout's formula (ops/dense_repack.py).
    n, k = 37, 7
    got = p[n // 16, k // 2, n % 16, k % 2] if dtype is torch.bfloat16 else p[n // 16, k, n % 16]
    assert got == w[n, k]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_fp64_reference(isa, dtype, bias):
    gen = torch.Generator().manual_seed(1 + 7 * ISAS.index(isa) + (dtype is torch.bfloat16) + 2 * bias)
    for M in ROWS:
        N, K = 16 * int(torch.randint(1, 12, (1,), generator=gen)), 2 * int(torch.randint(1, 120, (1,), generator=gen))
        x = torch.randn(M, K, generator=gen).to(dtype)
        w = (torch.randn(N, K, generator=gen) / K ** 0.5).to(dtype)
        b = torch.randn(N, generator=gen).to(dtype) if bias else None
        got = linear_ops.linear(x, pack_x16(w), b, isa=isa, x16=True)
        assert got.shape == (M, N) and got.dtype == dtype
        assert_close(got, reference(x, w, b), x, w, dtype)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_silu_mul_pairs_gate_and_up_groups(isa, dtype, bias):
    gen = torch.Generator().manual_seed(9)
    for M in ROWS:
        I, K = 80, 96  # 5 groups per half: a full 3-group panel and a 2-group one
        x = torch.randn(M, K, generator=gen).to(dtype)
        w = (torch.randn(2 * I, K, generator=gen) / K ** 0.5).to(dtype)
        b = torch.randn(2 * I, generator=gen).to(dtype) if bias else None
        got = linear_ops.linear(x, pack_x16(w), b, silu_mul=True, isa=isa, x16=True)
        assert got.shape == (M, I)
        assert_close(got, reference(x, w, b, silu_mul=True), x, w, dtype)


@pytest.mark.parametrize("isa", ISAS)
def test_fp32_activations_and_logits_on_bf16_weights(isa):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(17, 64, generator=gen)
    w = (torch.randn(64, 64, generator=gen) / 8).bfloat16()
    got = linear_ops.linear(x, pack_x16(w), isa=isa, x16=True)  # fp32 x widens the packed bf16 weight
    assert_close(got, reference(x, w.float()), x, w.float(), torch.float32)
    logits = linear_ops.linear(x.bfloat16(), pack_x16(w), out_dtype=torch.float32, isa=isa, x16=True)
    assert logits.dtype == torch.float32
    assert_close(logits, reference(x.bfloat16(), w), x.bfloat16(), w, torch.float32)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("x16", [False, True], ids=["rows", "x16"])
def test_fp16_weights_give_their_fp32_copys_bits(isa, x16):
    """fp16 weights (a GPTQ / AWQ head held as stored) under fp32 x: the kernel widens each weight exactly and
    sums in the fp32 kernel's order, so the output equals the fp32 copy's bit for bit, in both layouts."""
    gen = torch.Generator().manual_seed(11)
    for M in ROWS:
        N, K = 16 * int(torch.randint(1, 12, (1,), generator=gen)), int(torch.randint(1, 300, (1,), generator=gen))
        x = torch.randn(M, K, generator=gen)
        w = (torch.randn(N, K, generator=gen) / K ** 0.5).half()
        w[0, 0] = 2.0 ** -20  # an fp16 subnormal
        pack = pack_x16 if x16 else (lambda t: t)
        got = linear_ops.linear(x, pack(w), isa=isa, x16=x16)
        assert got.dtype == torch.float32 and torch.equal(got, linear_ops.linear(x, pack(w.float()), isa=isa, x16=x16))
        assert_close(got, reference(x, w.float()), x, w.float(), torch.float32)
    assert packed_shape(32, 6, torch.float16) == (2, 6, 16) and torch.equal(unpack_x16(pack_x16(w)), w)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_does_not_depend_on_the_rows_beside_it(isa, dtype):
    """Row r of an M-row call equals the row computed alone, bit for bit, for every M and task split
    (the decoder stack and the layer loop run different step sizes through the same kernel)."""
    torch.manual_seed(0)
    w = pack_x16(torch.randn(208, 200).to(dtype))  # 13 groups: 3-group panels and a 1-group rest
    x = torch.randn(40, 200).to(dtype)
    kernel = linear_ops.LinearKernel(w, out_dtype=torch.float32, isa=isa, x16=True)
    alone = torch.cat([kernel(x[r:r + 1].contiguous()) for r in range(40)])  # [40, 208]
    for M in list(range(2, 11)) + [17, 32, 33, 40]:  # across linear.cc's 32-row streaming switch
        assert torch.equal(kernel(x[:M].contiguous()), alone[:M]), f"{M} rows"
    try:
        _core.set_linear_tuning(16, 5)  # many small tasks: other threads, other tile remainders
        assert torch.equal(kernel(x), alone)
    finally:
        _core.set_linear_tuning()


def test_the_same_isa_family_gives_the_same_bits():
    """The portable 16-lane kernels are the AVX-512 ones' tiling with the same FMAs (and an emulated
    vdpbf16ps), so they agree bit for bit: the scalar path stands for the vector one in tests."""
    pairs = [("generic16", "avx512"), ("generic16_bf16", "avx512_bf16"), ("generic", "avx2")]
    torch.manual_seed(2)
    for portable, native in pairs:
        if native not in ISAS:
            continue
        for dtype in (torch.float32, torch.bfloat16):
            w = pack_x16((torch.randn(96, 130) / 12).to(dtype))
            x = torch.randn(11, 130).to(dtype)
            a = linear_ops.linear(x, w, isa=portable, x16=True, out_dtype=torch.float32)
            b = linear_ops.linear(x, w, isa=native, x16=True, out_dtype=torch.float32)
            assert torch.equal(a, b), (portable, native, dtype)


def test_shapes_the_layout_cannot_hold_are_refused():
    assert "multiple of 16" in x16_problem(torch.zeros(40, 8))
    assert "odd" in x16_problem(torch.zeros(32, 7, dtype=torch.bfloat16))
    assert x16_problem(torch.zeros(32, 7)) == ""  # fp32 holds any K
    assert "multiple of 16" in x16_problem(torch.zeros(48, 8), silu_mul=True)  # 24 per half
    with pytest.raises(ValueError, match="keep the checkpoint layout"):
        pack_x16(torch.zeros(40, 8))
    w = pack_x16(torch.randn(48, 8))
    with pytest.raises(ValueError, match="multiple of 16"):  # the kernel's own check: 24 outputs per half
        linear_ops.linear(torch.randn(2, 8), w, silu_mul=True, x16=True)
    with pytest.raises(ValueError, match="x16 layout"):
        linear_ops.LinearKernel(torch.randn(48, 8), x16=True)
