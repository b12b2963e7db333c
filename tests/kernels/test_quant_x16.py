"""The repacked 16-row kernels (q4_0x16, q4_1x16, q5_0x16, q5_1x16, q8_0x16, q4_kx16, q5_kx16, q6_kx16,
int8_per_channelx16: ops/quant_repack.py, cpp/kernels/quant_x16_impl.h, quant_kx16_impl.h) on every
ISA path that has them: repacking is lossless (unpack gives the file's bytes back), and the kernel
equals the exact-arithmetic reference of test_quant_linear.py (the same activation quantization: Q8_0
/ Q8_1 blocks of 32, Q8_K blocks of 256 for the k-quants, one scale per row for int8; W dequantised by
the gguf package, float64 product) and the ggml-layout (row-layout) kernel on the same weights; the
int8 one bit for bit. Q8_0x16 and int8_per_channelx16 without VNNI (AVX2, AVX-512BW) take the sign
trick (vpmaddubsw would saturate on the stored q + 128); a path this CPU cannot run is SKIPPED with the
missing flag."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

from pagedcore import _core
from pagedcore.ops.linear_isa import isa_code
from pagedcore.ops.quant_linear import FORMAT_ENUMS, QuantLinearKernel, row_bytes
from pagedcore.ops.quant_repack import REPACKED, gather_rows_x16, repack_x16, repackable, unpack_x16

from .test_quant_linear import _ISA_FLAGS, act_block, make_x, quantize_x, random_weight

_ALL_ISAS = ("generic", "generic16", "avx2", "avx512", "avx512_vnni", "avx512_bf16")
# ISA paths with a 16-lane kernel, per repacked format.
_X16_ISAS = {fmt: _ALL_ISAS for fmt in ("q4_0x16", "q4_1x16", "q5_0x16", "q5_1x16", "q8_0x16", "q4_kx16",
                                       "q5_kx16", "q6_kx16", "int8_per_channelx16")}
# Q8_0x16 sums the stored q + 128 bytes with vpdpbusd (and the portable path) but q itself by the sign
# trick on AVX2 / AVX-512BW: the same integers, rounded through one FMA fewer. Bits agree within a group.
_Q8_SIGNED_ISAS = ("avx2", "avx512")


def _is_k(fmt: str) -> bool:
    return fmt.removesuffix("x16").endswith("_k")


def _K(fmt: str, blocks: int) -> int:
    """K of `blocks` blocks of 32 (an odd count: a group of 8 and a tail), or 2 super-blocks of 256."""
    return 512 if _is_k(fmt) else 32 * blocks


def _params():
    params = []
    for fmt, isas in _X16_ISAS.items():
        for isa in isas:
            marks = [] if _core.kernel_isa_supported(isa) else [
                pytest.mark.skip(reason=f"this CPU lacks {_ISA_FLAGS[isa]}")]
            params.append(pytest.param(fmt, isa, marks=marks, id=f"{fmt}-{isa}"))
    return params


@pytest.mark.parametrize("ggml", sorted(REPACKED))
def test_repacking_is_lossless(ggml):
    rng = np.random.default_rng(3)
    K = _K(ggml, 11)
    weight, _, _ = random_weight(ggml, 48, K, rng)  # random bytes: every scale, minimum and quant pattern
    packed = repack_x16(weight, ggml, K)
    assert packed.shape == (48, row_bytes(REPACKED[ggml], K)) and packed.dtype == weight.dtype
    assert not torch.equal(packed[:, :weight.shape[1]], weight)
    assert torch.equal(unpack_x16(packed, REPACKED[ggml], K), weight)
    with pytest.raises(ValueError, match="N a multiple of 16"):
        repack_x16(weight[:40], ggml, K)


def test_bytes_per_weight_of_the_repacked_formats():
    """The 32-weight formats keep their bytes; the k-quants' 12 packed bytes of 6-bit scales and
    minimums become 16 (one byte each): 148 / 180 bytes per 256 weights against 144 / 176; Q6_K's
    int8 scales are bytes already (210)."""
    per_256 = {fmt: row_bytes(REPACKED[fmt], 256) - row_bytes(fmt, 256) for fmt in REPACKED}
    assert per_256 == {"q4_0": 0, "q4_1": 0, "q5_0": 0, "q5_1": 0, "q8_0": 0, "q4_k": 4, "q5_k": 4, "q6_k": 0,
                       "int8_per_channel": 0}
    assert row_bytes("q4_kx16", 256) / 256 == 0.578125 and row_bytes("q5_kx16", 256) / 256 == 0.703125


@pytest.mark.parametrize("fmt, isa", _params())
@pytest.mark.parametrize("case", ["decode", "silu_mul_bias", "rows_9", "rows_17", "rows_64", "prefill"])
def test_x16_kernel_matches_reference_and_ggml_layout(fmt, isa, case):
    ggml = fmt[:-3]
    rng = np.random.default_rng(zlib.crc32(f"{fmt}/{case}".encode()))
    N, K = 64, _K(fmt, 11)  # 4 row groups (2 per half for SwiGLU); 11 blocks of 32 or 2 super-blocks
    M = {"decode": 1, "silu_mul_bias": 3, "rows_9": 9, "rows_17": 17, "rows_64": 64, "prefill": 70}[case]
    weight, scales, w = random_weight(ggml, N, K, rng)
    packed = repack_x16(weight, ggml, K)
    silu = case == "silu_mul_bias"
    bias = torch.from_numpy(rng.standard_normal(N).astype(np.float32)) if silu else None
    x = make_x(M, K, rng, torch.float32)
    y = QuantLinearKernel(packed, fmt, K, bias, scales=scales, silu_mul=silu, isa=isa)(x)
    ggml_y = QuantLinearKernel(weight, ggml, K, bias, scales=scales, silu_mul=silu,
                               isa=isa if isa != "avx512_vnni" else "auto")(x)
    if scales is not None:  # int8: the same integers and the same float products as the row layout
        assert torch.equal(y, ggml_y), f"{fmt}/{isa}/{case}: differs from the row layout"
    y = y.double().numpy()

    q, d = quantize_x(x, act_block(ggml, K))
    x_hat = q * d
    ref, scale = x_hat @ w.T, np.abs(x_hat) @ np.abs(w).T
    if silu:
        ref = ref + bias.double().numpy()
        g, u = ref[:, : N // 2], ref[:, N // 2:]
        ref = g / (1 + np.exp(-g)) * u
        scale = scale[:, : N // 2] * (np.abs(u) + 1) + scale[:, N // 2:] * (np.abs(g) + 1)
    tol = 2e-5 * scale + 1e-6
    assert y.shape == ref.shape
    assert (np.abs(y - ref) <= tol).all(), f"{fmt}/{isa}/{case}: max err {np.abs(y - ref).max()}"
    assert (np.abs(y - ggml_y.double().numpy()) <= 2 * tol).all()


@pytest.mark.parametrize("fmt", ["q4_0x16", "q4_1x16", "q5_0x16", "q5_1x16", "q8_0x16"])
def test_the_32_weight_kernels_give_the_same_bits_on_every_isa(fmt):
    """Integer sums are exact on every path (vpdpbusd; vpmaddubsw pairs summed in int16 for a block's
    nibbles, then widened; 5-bit weights widened after every 4 products; the generic loops) and the float
    epilogue is the same FMAs per lane: so every ISA gives the same bits. Half the weight rows have every
    nibble / byte (and fifth bit) at its maximum and the activations sit at +-127 (the int16 pair sums'
    worst case)."""
    ggml = fmt[:-3]
    N, K = 64, 32 * 9
    rng = np.random.default_rng(7)
    weight, _, _ = random_weight(ggml, N, K, rng)
    block_bytes = {"q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "q8_0": 34}[ggml]
    blocks = weight.view(N, K // 32, block_bytes)
    first_q = block_bytes - {"q8_0": 32, "q5_0": 20, "q5_1": 20}.get(ggml, 16)  # (Q5: qh, then qs)
    blocks[: N // 2, :, first_q:] = 0xFF if ggml != "q8_0" else 0x7F
    packed = repack_x16(weight, ggml, K)
    x = make_x(37, K, rng, torch.float32)
    x[2], x[3] = 1.0, -1.0  # every activation at +127 / -127 after quantization
    isas = [isa for isa in _X16_ISAS[fmt] if _core.kernel_isa_supported(isa)]
    groups = [isas] if fmt != "q8_0x16" else [[i for i in isas if i not in _Q8_SIGNED_ISAS],
                                               [i for i in isas if i in _Q8_SIGNED_ISAS]]
    for group in (g for g in groups if g):
        for m in (1, 2, 5, 37):
            results = {isa: QuantLinearKernel(packed, fmt, K, isa=isa)(x[:m]) for isa in group}
            first = results[group[0]]
            for isa, y in results.items():
                assert torch.equal(y, first), f"{fmt}, {m} rows: {isa} differs from {group[0]}"
        print(f"{fmt}: bit-identical on {', '.join(group)}")


@pytest.mark.parametrize("ggml", ["q4_1", "q4_k"])
def test_rows_not_in_groups_of_16_are_refused(ggml):
    K = _K(ggml, 2)
    weight, _, _ = random_weight(ggml, 48, K, np.random.default_rng(2))
    # 48 rows repack, but SwiGLU's halves of 24 rows are not whole groups.
    kernel = QuantLinearKernel(repack_x16(weight, ggml, K), REPACKED[ggml], K, silu_mul=True, isa="generic")
    with pytest.raises(ValueError, match=r"groups of 16 rows; N = 48 \(24 outputs per half\)"):
        kernel(torch.ones(1, K))
    assert repackable("q4_1", 40) is None and repackable("q6_k", 40) is None and repackable("q4_1", 0) is None
    assert repackable("q8_k", 64) is None and repackable("int8_per_channel", 40) is None


@pytest.mark.parametrize("ggml", sorted(REPACKED))
def test_repacked_where_a_simd_kernel_runs(ggml):
    """Whole 16-row groups repack where the CPU's quantized ISA has a SIMD 16-lane kernel (the
    portable one is for tests: a CPU without AVX2 keeps the file layout)."""
    isa = _core.quant_kernel_isa_for(FORMAT_ENUMS[REPACKED[ggml]])
    assert repackable(ggml, 64) == (REPACKED[ggml] if isa in ("avx2", "avx512", "avx512_vnni") else None)
    assert repackable(ggml, 64, isa="generic") is None


@pytest.mark.parametrize("ggml", sorted(REPACKED))
def test_gathered_rows_are_the_file_rows(ggml):
    """An embedding lookup in a repacked table reads back exactly the file's row bytes."""
    K = _K(ggml, 3)
    weight, _, _ = random_weight(ggml, 64, K, np.random.default_rng(4))
    packed = repack_x16(weight, ggml, K)
    rows = torch.tensor([0, 17, 63, 17, 5, 32], dtype=torch.int64)
    assert torch.equal(gather_rows_x16(packed, rows, REPACKED[ggml], K), weight[rows])


def test_int8_x16_gives_the_row_layouts_bits_at_the_integer_extremes():
    """Every weight at -128 or +127 and the activations at +-127 (the int32 sums' worst case at K = 4096):
    the x16 kernel equals the row-layout kernel bit for bit on every ISA that has it, at 1-37 rows."""
    N, K = 64, 4096
    rng = np.random.default_rng(11)
    weight, scales, _ = random_weight("int8_per_channel", N, K, rng)
    weight[: N // 2] = torch.where(torch.from_numpy(rng.integers(0, 2, (N // 2, K)).astype(bool)), -128, 127).to(torch.int8)
    packed = repack_x16(weight, "int8_per_channel", K)
    x = make_x(37, K, rng, torch.float32)
    x[3], x[4] = 1.0, -1.0
    isas = [isa for isa in _X16_ISAS["int8_per_channelx16"] if _core.kernel_isa_supported(isa)]
    for m in (1, 2, 5, 37):
        want = QuantLinearKernel(weight, "int8_per_channel", K, scales=scales, isa="generic")(x[:m])
        for isa in isas:
            got = QuantLinearKernel(packed, "int8_per_channelx16", K, scales=scales, isa=isa)(x[:m])
            assert torch.equal(got, want), f"{m} rows: {isa} differs from the row layout"
    print(f"int8_per_channelx16: bit-identical to the row layout on {', '.join(isas)}")


def test_int8_rows_repack_where_the_kernel_takes_them():
    """K a multiple of 4 and at most 65536 (the int32 sums), whole groups of 16, a SIMD CPU; int8 in, int8 out."""
    simd = _core.quant_kernel_isa_for(FORMAT_ENUMS["int8_per_channelx16"]) in ("avx2", "avx512", "avx512_vnni")
    want = "int8_per_channelx16" if simd else None
    assert repackable("int8_per_channel", 64, K=576) == want and repackable("int8_per_channel", 64) == want
    assert repackable("int8_per_channel", 64, K=578) is None and repackable("int8_per_channel", 64, K=65540) is None
    weight, _, _ = random_weight("int8_per_channel", 32, 12, np.random.default_rng(5))
    with pytest.raises(ValueError, match="int8 \\[N, 12\\] with N a multiple of 16"):
        repack_x16(weight.view(torch.uint8), "int8_per_channel", 12)
