"""A torch oracle with QuantLinearKernel's constructor and call (ops/quant_linear.py), doing the
same arithmetic in float64: weights dequantised (gguf.quants for the block formats, q * scale for
int8 per channel), activations quantized per block as the kernels do (blocks of 32 for the
32-weight formats, 256 for the k-quants, the whole row for int8 per channel; d = max|x| / 127,
q = round-half-even(x * (1 / d)) clamped to [-127, 127], in fp32), then x_q * d . w. fp8 e4m3 weights
(scale * fp8 value) multiply the activations as they are (weight-only). Test-only."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from gguf import quants as gguf_quants

from .blocks import FORMATS


def activation_block(weight_format: str, K: int) -> int | None:
    """Inputs per activation scale; None: activations not quantized (fp8 weights)."""
    if weight_format.removesuffix("x16") == "fp8_e4m3":
        return None
    if weight_format.removesuffix("x16") == "int8_per_channel":
        return K
    return 256 if weight_format.removesuffix("x16").endswith("_k") else 32  # q4_kx16: Q8_K as q4_k


def quantize_activations(x: torch.Tensor, block: int | None) -> torch.Tensor:
    """x fp32 [M, K] -> the values the kernel multiplies: q * d, fp64 [M, K] (block None: x itself)."""
    if block is None:
        return x.double()
    blocks = x.float().reshape(x.shape[0], -1, block)  # [M, K / block, block]
    d = blocks.abs().amax(-1, keepdim=True) / 127.0  # fp32 [M, K / block, 1]
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(blocks * inv).clamp_(-127, 127)  # round half to even, like the kernel
    return (q.double() * d.double()).reshape(x.shape)


def dequantize_weight(weight: torch.Tensor, weight_format: str, K: int,
                      scales: torch.Tensor | None = None, block_k: int | None = None) -> torch.Tensor:
    """[N, row_bytes] blocks (or int8 / fp8 [N, K] + scales [N]; fp8 with block_k: scales [N / 16, KB]) -> fp64
    [N, K]."""
    if weight_format.endswith("x16"):  # repacked 16-row groups: the file's rows again, then as below
        from pagedcore.ops.quant_repack import unpack_x16

        weight, weight_format = unpack_x16(weight, weight_format, K), weight_format.removesuffix("x16")
    if weight_format == "int8_per_channel":
        return weight.double() * scales.double()[:, None]
    if weight_format == "fp8_e4m3":  # uint8 [N, K] e4m3 codes
        values = weight.view(torch.float8_e4m3fn).double()
        if block_k is not None:  # each weight times its 16-row group's scale of its k-block
            groups = torch.arange(weight.shape[0]) // 16
            blocks = torch.arange(K) // block_k
            return values * scales.double()[groups][:, blocks]
        return values * scales.double()[:, None]
    values = gguf_quants.dequantize(np.ascontiguousarray(weight.numpy()), FORMATS[weight_format])
    return torch.from_numpy(values.reshape(weight.shape[0], K)).double()


class ReferenceQuantLinear:
    def __init__(self, weight, weight_format, K, bias=None, *, scales=None, silu_mul=False,
                 x_dtype=torch.float32, out_dtype=None, isa="auto", block_k=None):
        self.weight = weight
        self.w = dequantize_weight(weight, weight_format, K, scales, block_k)  # fp64 [N, K]
        self.bias = None if bias is None else bias.double()
        self.block = activation_block(weight_format, K)
        self.silu_mul = silu_mul
        self.out_dtype = out_dtype

    def matches(self, weight: torch.Tensor) -> bool:
        return weight.data_ptr() == self.weight.data_ptr()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = quantize_activations(x, self.block) @ self.w.T  # fp64 [M, N]
        if self.bias is not None:
            y = y + self.bias
        if self.silu_mul:
            half = y.shape[-1] // 2
            y = F.silu(y[:, :half]) * y[:, half:]
        return y.to(self.out_dtype or x.dtype)


def quantize_int8_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle's own per-row int8 quantization (scale = max|w| / 127, round half to even), for
    checking the ops' one: int8 [N, K], fp32 [N]."""
    scales = w.abs().amax(-1) / 127.0
    inv = torch.where(scales != 0, 1.0 / scales, torch.zeros_like(scales))
    return torch.round(w * inv[:, None]).clamp_(-127, 127).to(torch.int8), scales


def use_reference_kernels(monkeypatch) -> None:
    """Every QuantLinearKernel built from now on in this test is the oracle (models loaded from now
    on run the Python layer loop: the C++ decoder stack calls the kernels without this binding; it
    is held to the layer loop by test_quant_stack.py)."""
    from pagedcore.ops import quant_linear

    monkeypatch.setenv("PAGEDCORE_DECODER_STACK", "0")

    monkeypatch.setattr(quant_linear, "QuantLinearKernel", ReferenceQuantLinear)


class CheckedKernels:
    """Installs a QuantLinearKernel that runs the real kernel and, on the same input, the oracle:
    every call's error (max |kernel - oracle| / max |oracle|) is recorded by format, so a whole
    model run checks each kernel call at the activations it really sees."""

    def __init__(self, monkeypatch):
        from pagedcore.ops import quant_linear

        monkeypatch.setenv("PAGEDCORE_DECODER_STACK", "0")  # every call through this binding (see above)

        real = quant_linear.QuantLinearKernel
        self.worst: dict[str, float] = {}  # format -> largest relative error of any call
        self.calls: dict[str, int] = {}
        checks = self

        class Checked:
            def __init__(self, weight, weight_format, K, bias=None, **kwargs):
                self.format = weight_format.removesuffix("x16")  # recorded by file format (repacked or not)
                self.kernel = real(weight, weight_format, K, bias, **kwargs)
                self.oracle = ReferenceQuantLinear(weight, weight_format, K, bias, **kwargs)

            def matches(self, weight):
                return self.kernel.matches(weight)

            def __call__(self, x):
                y = self.kernel(x)
                expected = self.oracle(x)
                error = ((y.double() - expected.double()).abs().max() / expected.abs().max().clamp_min(1e-30)).item()
                checks.worst[self.format] = max(checks.worst.get(self.format, 0.0), error)
                checks.calls[self.format] = checks.calls.get(self.format, 0) + 1
                return y

        monkeypatch.setattr(quant_linear, "QuantLinearKernel", Checked)
