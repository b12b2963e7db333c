"""fp8 e4m3 x16 weights with block-wise scales (DeepSeek / Qwen3 FP8's 128 x 128 blocks; ops/quant_linear.py
QuantLinearKernel(..., block_k=...), cpp/kernels/linear.h weight_block_scales) on every ISA this CPU runs (the others
SKIPPED with the reason), against a float64 oracle of sum_k x[m, k] * fp8(W[n, k]) * scale[n // 16][k // block_k]:
K off the block size, fp32 and bf16 x, bias and the SwiGLU epilogue; a table of one scale per group equals the
per-row-scaled kernel; the wrapper's refusals."""

from __future__ import annotations

import pytest
import torch

from pagedcore.ops.quant_linear import QuantLinearKernel
from pagedcore.ops.quant_repack import repack_x16

from .test_fp8_weight_kernels import ISAS, random_e4m3, values


def block_layer(N: int, K: int, block_k: int, seed: int):
    """(w uint8 [N, K] rows, scales fp32 [N / 16, ceil(K / block_k)] of both signs, bias fp32 [N])."""
    gen = torch.Generator().manual_seed(seed)
    k_blocks = -(-K // block_k)
    scales = (torch.rand(N // 16, k_blocks, generator=gen) * 3e-3 + 1e-3)
    scales = scales * torch.where(torch.arange(N // 16 * k_blocks).reshape(N // 16, k_blocks) % 7 == 2, -1.0, 1.0)
    return random_e4m3(N, K, gen), scales.contiguous(), torch.randn(N, generator=gen)


def scaled_weights(w: torch.Tensor, scales: torch.Tensor, block_k: int) -> torch.Tensor:
    """float64 [N, K]: each weight times its 16-row group's scale of its k-block."""
    N, K = w.shape
    per_weight = scales.double()[torch.arange(N) // 16][:, torch.arange(K) // block_k]
    return values(w) * per_weight


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("M, N, K, block_k", [(1, 48, 384, 128), (5, 32, 300, 128), (9, 64, 260, 64),
                                              (2, 96, 36, 8), (17, 16, 128, 128)])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_block_scales_equal_the_float64_oracle(isa, M, N, K, block_k, x_dtype):
    w, scales, bias = block_layer(N, K, block_k, seed=M * 1000 + K)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(K)).to(x_dtype)
    packed = repack_x16(w, "fp8_e4m3", K)
    w64 = scaled_weights(w, scales, block_k)
    for with_bias in (False, True):
        kernel = QuantLinearKernel(packed, "fp8_e4m3x16", K, bias if with_bias else None, scales=scales,
                                   x_dtype=x_dtype, out_dtype=torch.float32, isa=isa, block_k=block_k)
        got = kernel(x).double()
        expected = x.double() @ w64.T + (bias.double() if with_bias else 0.0)
        tolerance = 4e-6 * (x.double().abs() @ w64.abs().T) + 1e-6
        assert ((got - expected).abs() <= tolerance).all(), f"{isa} bias={with_bias}: {(got - expected).abs().max()}"


@pytest.mark.parametrize("isa", ISAS)
def test_block_scales_silu_mul(isa):
    N, K, block_k = 64, 300, 128  # gate rows 0..31, up rows 32..63: two groups each
    w, scales, bias = block_layer(N, K, block_k, seed=5)
    x = torch.randn(7, K, generator=torch.Generator().manual_seed(6))
    kernel = QuantLinearKernel(repack_x16(w, "fp8_e4m3", K), "fp8_e4m3x16", K, bias, scales=scales, silu_mul=True,
                               isa=isa, block_k=block_k)
    y = x.double() @ scaled_weights(w, scales, block_k).T + bias.double()
    expected = torch.nn.functional.silu(y[:, :32]) * y[:, 32:]
    torch.testing.assert_close(kernel(x).double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("isa", ISAS)
def test_one_scale_per_group_equals_the_row_scaled_kernel(isa):
    N, K = 48, 256
    w, scales, _ = block_layer(N, K, 128, seed=9)
    scales[:, 1] = scales[:, 0]  # both k-blocks of a group share its scale
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(1))
    packed = repack_x16(w, "fp8_e4m3", K)
    blocks = QuantLinearKernel(packed, "fp8_e4m3x16", K, scales=scales.contiguous(), isa=isa, block_k=128)(x)
    rows = QuantLinearKernel(packed, "fp8_e4m3x16", K, scales=scales[:, 0].repeat_interleave(16).contiguous(),
                             isa=isa)(x)
    torch.testing.assert_close(blocks, rows, rtol=1e-5, atol=1e-6)


def test_block_scales_are_refused_where_they_do_not_fit():
    w, scales, _ = block_layer(32, 256, 128, seed=2)
    packed = repack_x16(w, "fp8_e4m3", 256)
    with pytest.raises(ValueError, match="go with fp8_e4m3x16 weights"):
        QuantLinearKernel(w, "fp8_e4m3", 256, scales=scales, block_k=128)
    with pytest.raises(ValueError, match="multiple of 4"):
        QuantLinearKernel(packed, "fp8_e4m3x16", 256, scales=scales, block_k=6)
    with pytest.raises(ValueError, match=r"shape \(2, 2\)"):
        QuantLinearKernel(packed, "fp8_e4m3x16", 256, scales=scales[:, :1].contiguous(), block_k=128)
