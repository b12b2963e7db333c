"""The quantized linear kernels (pagedcore.ops.quant_linear) against two oracles, on every ISA path:

1. exact-arithmetic reference: x quantized per block the way the kernel does it (reproduced here in
   float32 numpy), W dequantised by the `gguf` package's reference dequantizers (or q * scale for
   int8_per_channel), the product in float64: equal to float tolerance;
2. plain dequantise-then-matmul with fp32 x: equal within the bound the activation rounding allows
   (half a quantization step of x per element, times |W|).

Weights are random blocks (random bytes: every nibble, sign, 6-bit scale and minimum occurs) with
random fp16 scales of both signs. The ISA list names every path; a path this CPU cannot run is
SKIPPED with the missing instruction-set flag in the reason.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

gguf_quants = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType  # noqa: E402

from pagedcore import _core  # noqa: E402
from pagedcore.ops.quant_linear import (  # noqa: E402
    GGUF_FORMATS, INT8_FORMAT, QuantLinearKernel, block_size, quantize_int8_per_channel, row_bytes)

FORMATS = GGUF_FORMATS + (INT8_FORMAT,)
_GGML = {"q8_0": GGMLQuantizationType.Q8_0, "q4_0": GGMLQuantizationType.Q4_0, "q4_1": GGMLQuantizationType.Q4_1,
         "q4_k": GGMLQuantizationType.Q4_K, "q5_k": GGMLQuantizationType.Q5_K, "q6_k": GGMLQuantizationType.Q6_K,
         "q5_0": GGMLQuantizationType.Q5_0, "q5_1": GGMLQuantizationType.Q5_1}
# (byte offset, magnitude) of each fp16 field of a block, so the random weights are of order 1.
_F16_FIELDS = {"q8_0": [(0, 2e-2)], "q4_0": [(0, 0.1)], "q4_1": [(0, 0.1), (2, 0.5)],
               "q4_k": [(0, 2e-3), (2, 2e-3)], "q5_k": [(0, 1e-3), (2, 1e-3)], "q6_k": [(208, 1e-4)],
               "q5_0": [(0, 0.05)], "q5_1": [(0, 0.05), (2, 0.5)]}
_BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "q4_k": 144, "q5_k": 176, "q6_k": 210}

# ISA paths of the quantized family (cpu_isa.h's rule): the name, and the CPU flag it needs.
_ISA_FLAGS = {"generic": None, "generic16": None, "avx2": "avx2+fma+f16c", "avx512": "avx512f+bw+vl+dq",
              "avx512_vnni": "avx512_vnni", "avx512_bf16": "avx512_bf16 (runs the vnni path)",
              "amx_int8": "amx_int8"}


def _isa_params():
    params = []
    for name, flag in _ISA_FLAGS.items():
        if name == "amx_int8":
            reason = "amx_int8: no AMX-INT8 kernel is built (no machine with AMX to run it on)"
            params.append(pytest.param(name, marks=pytest.mark.skip(reason=reason), id=name))
        elif _core.kernel_isa_supported(name):
            params.append(pytest.param(name, id=name))
        else:
            params.append(pytest.param(name, marks=pytest.mark.skip(reason=f"this CPU lacks {flag}"), id=name))
    return params


ISAS = _isa_params()


def random_weight(fmt: str, N: int, K: int, rng: np.random.Generator):
    """(weight tensor for the kernel, scales or None, dequantised W float64 [N, K])."""
    if fmt == INT8_FORMAT:
        q = rng.integers(-128, 128, size=(N, K), dtype=np.int8)  # -128 too: the kernels' |w| edge
        scales = rng.uniform(0.5, 1.5, size=N).astype(np.float32) * np.float32(1 / 64)
        return torch.from_numpy(q), torch.from_numpy(scales), q.astype(np.float64) * scales[:, None].astype(np.float64)
    raw = rng.integers(0, 256, size=(N, row_bytes(fmt, K)), dtype=np.uint8)
    blocks = raw.reshape(N, -1, _BLOCK_BYTES[fmt])
    for offset, scale in _F16_FIELDS[fmt]:
        values = (rng.uniform(0.25, 1.0, size=blocks.shape[:2]) * rng.choice([-1.0, 1.0], size=blocks.shape[:2])
                  * scale).astype(np.float16)
        blocks[:, :, offset:offset + 2] = values.view(np.uint8).reshape(*blocks.shape[:2], 2)
    w = gguf_quants.dequantize(raw, _GGML[fmt]).astype(np.float64)
    assert w.shape == (N, K)
    return torch.from_numpy(raw), None, w


def quantize_x(x: torch.Tensor, block: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's activation quantization in float32 numpy: per block d = max|x| / 127,
    q = rint(x * (1 / d)) in [-127, 127]. Returns (q [M, K], d per element [M, K]) as float64."""
    x32 = x.float().numpy()
    M, K = x32.shape
    xb = x32.reshape(M, K // block, block)
    d = (np.abs(xb).max(axis=2) / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(xb * inv[..., None]), -127, 127)
    return q.reshape(M, K).astype(np.float64), np.repeat(d, block, axis=1).astype(np.float64)


def make_x(M: int, K: int, rng: np.random.Generator, dtype: torch.dtype) -> torch.Tensor:
    x = rng.standard_normal((M, K)).astype(np.float32)
    if M > 2:
        x[1] = 0.0                  # an all-zero row: scale 0
        x[2, K // 3] = 40.0         # an outlier dominating its block
    return torch.from_numpy(x).to(dtype)


def act_block(fmt: str, K: int) -> int:
    return K if fmt == INT8_FORMAT else (256 if fmt.endswith("_k") else 32)


def sizes(fmt: str) -> tuple[int, int]:
    """(N, K): N not a multiple of any tile; K 11 32-blocks (a group of 8 and an odd tail), or 2 super-blocks, or not a
    multiple of 32 (int8: the scalar tail)."""
    if fmt == INT8_FORMAT:
        return 26, 100
    return (22, 512) if fmt.endswith("_k") else (22, 352)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", ["decode", "bias_bf16", "silu_mul", "prefill"])
def test_quant_linear_matches_reference(fmt, isa, case):
    rng = np.random.default_rng(zlib.crc32(f"{fmt}/{case}".encode()))   # stable: str hash() is salted per process
    N, K = sizes(fmt)
    M = {"decode": 1, "bias_bf16": 5, "silu_mul": 7, "prefill": 70}[case]
    x_dtype = torch.bfloat16 if case in ("bias_bf16", "silu_mul") else torch.float32
    out_dtype = torch.bfloat16 if case == "bias_bf16" else torch.float32
    weight, scales, w = random_weight(fmt, N, K, rng)
    bias = torch.from_numpy(rng.standard_normal(N).astype(np.float32)) if case in ("bias_bf16", "silu_mul") else None
    if case == "bias_bf16":
        bias = bias.to(torch.bfloat16)
    silu = case == "silu_mul"
    kernel = QuantLinearKernel(weight, fmt, K, bias, scales=scales, silu_mul=silu, x_dtype=x_dtype,
                               out_dtype=out_dtype, isa=isa)
    x = make_x(M, K, rng, x_dtype)
    y = kernel(x).double().numpy()

    q, d = quantize_x(x, act_block(fmt, K))
    x_hat = q * d
    ref = x_hat @ w.T                                     # float64, same activation rounding
    scale = np.abs(x_hat) @ np.abs(w).T                   # size of the sums: the float tolerance
    if bias is not None:
        ref = ref + bias.double().numpy()
    if silu:
        g, u = ref[:, : N // 2], ref[:, N // 2:]
        ref = g / (1 + np.exp(-g)) * u
        scale = (scale[:, : N // 2] * (np.abs(u) + 1) + scale[:, N // 2:] * (np.abs(g) + 1))
    tol = 2e-5 * scale + 1e-6
    if out_dtype == torch.bfloat16:
        tol = tol + np.abs(ref) * 2 ** -8
    assert y.shape == ref.shape
    bad = np.abs(y - ref) > tol
    assert not bad.any(), f"{fmt}/{isa}/{case}: max err {np.abs(y - ref).max()} at {np.argwhere(bad)[:3]}"

    if case in ("decode", "prefill"):  # against fp32 x: within half a quantization step per element
        plain = x.double().numpy() @ w.T
        bound = 0.5 * (d @ np.abs(w).T) * 1.001 + 2e-5 * scale + 1e-6
        assert (np.abs(y - plain) <= bound).all()
        rel = np.linalg.norm(y - plain) / np.linalg.norm(plain)
        # The sanity bound widens with the activation block: one int8 scale per 32 values, per 256
        # (k-quants' Q8_K) or per row (int8_per_channel), so coarser steps in x.
        assert rel < (0.05 if fmt == INT8_FORMAT else 0.035 if fmt.endswith("_k") else 0.02), rel


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_isa_path_agrees_and_auto_runs(fmt):
    """All supported paths give the same outputs to float tolerance on a larger call (many tasks)."""
    rng = np.random.default_rng(7)
    N, K = (300, 768) if fmt.endswith("_k") else (300, 608)
    weight, scales, _ = random_weight(fmt, N, K, rng)
    x = make_x(45, K, rng, torch.float32)
    outs = {isa: QuantLinearKernel(weight, fmt, K, scales=scales, isa=isa)(x)
            for isa in ["auto"] + [n for n in _ISA_FLAGS if n != "amx_int8" and _core.kernel_isa_supported(n)]}
    base = outs["generic"]
    for isa, y in outs.items():
        torch.testing.assert_close(y, base, rtol=1e-4, atol=1e-4 * base.abs().max().item(), msg=isa)


def test_quantize_int8_per_channel_round_trip():
    w = torch.randn(40, 70)
    w[3] = 0
    q, s = quantize_int8_per_channel(w)
    assert q.dtype == torch.int8 and s.dtype == torch.float32 and q.shape == w.shape and s.shape == (40,)
    assert (q.float() * s[:, None] - w).abs().le(s[:, None] / 2 + 1e-6).all()
    assert s[3] == 1 and (q[3] == 0).all()


def test_w8a8_close_to_fp32_linear():
    torch.manual_seed(0)
    w, x = torch.randn(64, 256) * 0.05, torch.randn(9, 256)
    b = torch.randn(64)
    q, s = quantize_int8_per_channel(w)
    y = QuantLinearKernel(q, INT8_FORMAT, 256, b, scales=s)(x)
    ref = F.linear(x, w, b)
    assert (y - ref).norm() / ref.norm() < 0.02


def test_helpers_and_errors():
    assert [block_size(f) for f in FORMATS] == [32, 32, 32, 32, 32, 256, 256, 256, 1]
    assert row_bytes("q4_1", 576) == 18 * 20 and row_bytes("q6_k", 512) == 420 and row_bytes(INT8_FORMAT, 7) == 7
    with pytest.raises(ValueError, match="q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, int8_per_channel"):
        block_size("q3_k")
    with pytest.raises(ValueError, match="blocks of 256 along K; K = 576"):
        row_bytes("q4_k", 576)
    w = torch.zeros(4, row_bytes("q8_0", 64), dtype=torch.uint8)
    with pytest.raises(ValueError, match="blocks of 32"):
        QuantLinearKernel(w, "q8_0", 48)
    with pytest.raises(TypeError, match="torch.uint8"):
        QuantLinearKernel(w.to(torch.int8), "q8_0", 64)
    with pytest.raises(ValueError, match=r"\[N, 136\]"):
        QuantLinearKernel(w, "q8_0", 128)
    with pytest.raises(ValueError, match="needs scales"):
        QuantLinearKernel(torch.zeros(4, 64, dtype=torch.int8), INT8_FORMAT, 64)
    with pytest.raises(ValueError, match="int8_per_channel only"):
        QuantLinearKernel(w, "q8_0", 64, scales=torch.ones(4))
    with pytest.raises(ValueError, match="even number"):
        QuantLinearKernel(w[:3], "q8_0", 64, silu_mul=True)
    k = QuantLinearKernel(w, "q8_0", 64)
    assert k.matches(w) and not k.matches(w.clone())
    with pytest.raises(TypeError, match="torch.float32"):
        k(torch.zeros(2, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"\[num_rows, 64\]"):
        k(torch.zeros(2, 63))
    assert k(torch.zeros(0, 64)).shape == (0, 4)
    assert (k(torch.ones(3, 64)) == 0).all()  # all-zero blocks (scale 0)
