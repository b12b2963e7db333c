"""silu_mul (cpp/kernels/silu_mul.h): the SwiGLU a LoRA step runs after gate_up's adapter terms, in the
C++ decoder stack and in the layer loop alike. Held bit for bit to the linear kernel's fused SwiGLU
epilogue (gate_up with nothing added in between), and to torch's silu(gate) * up within rounding."""

from __future__ import annotations

import pytest
import torch

from pagedcore import _core
from pagedcore.layers.activation import silu_and_mul, silu_mul
from pagedcore.ops.dtypes import CPU_DTYPE_CODES
from pagedcore.ops.linear import LinearKernel


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5, 40])  # 40 x 520: the threaded path
def test_equals_the_fused_epilogue(dtype, rows):
    g = torch.Generator().manual_seed(rows)
    weight = (torch.randn(2 * 520, 96, generator=g) * 0.3).to(dtype)  # [2 I, K], I not a multiple of 16
    x = torch.randn(rows, 96, generator=g).to(dtype)
    fused = LinearKernel(weight, silu_mul=True)(x)  # [rows, I]
    gate_up = LinearKernel(weight)(x)               # [rows, 2 I]
    got = silu_mul(gate_up)
    assert got.dtype == dtype and got.shape == (rows, 520)
    assert torch.equal(got, fused)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_close_to_torch(dtype):
    g = torch.Generator().manual_seed(0)
    gate_up = (torch.randn(7, 2 * 300, generator=g) * 4).to(dtype)
    got, want = silu_mul(gate_up).float(), silu_and_mul(gate_up).float()
    tol = 1e-6 if dtype is torch.float32 else 2 ** -7  # bf16: one rounding of a product may flip
    assert torch.allclose(got, want, rtol=tol, atol=tol), (got - want).abs().max()


def test_strided_rows_and_fallback():
    g = torch.Generator().manual_seed(1)
    wide = torch.randn(3, 2 * 64 + 8, generator=g)
    view = wide[:, :128]  # rows 136 apart
    assert torch.equal(silu_mul(view), silu_mul(view.contiguous()))
    as_double = view.double()  # not a kernel dtype: torch's op
    assert torch.allclose(silu_mul(as_double), silu_and_mul(as_double))
    assert silu_mul(torch.empty(0, 8)).shape == (0, 4)


def test_bad_strides_are_refused():
    gate_up, out = torch.zeros(2, 16), torch.zeros(2, 8)
    with pytest.raises(ValueError, match="row strides"):
        _core.silu_mul_cpu(gate_up.data_ptr(), out.data_ptr(), 2, 8, 12, 8, CPU_DTYPE_CODES[torch.float32])
