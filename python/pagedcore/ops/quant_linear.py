"""Linear layers on quantized weights, kept quantized (cpp/kernels/quant_linear.h): y = x @ W.T (+ b)
with W in a GGUF block format (ggml's exact bytes: the loader hands a file's tensor over untouched)
or int8 per output channel (W8A8). Each call quantizes x per block to int8 as llama.cpp does (Q8_0 /
Q8_1 blocks of 32 for q8_0, q4_0, q4_1, q5_0, q5_1; Q8_K blocks of 256 for the k-quants; one scale per row for
int8_per_channel) and runs integer dot products (vpmaddubsw on AVX2 / AVX-512BW, vpdpbusd on
AVX512-VNNI, a portable path elsewhere) with fp32 block-scale accumulation. The bias and the
SwiGLU epilogue (silu_mul) are the dense kernel's.

fp8 e4m3 weights with one fp32 scale per output row (vLLM's "fp8", compressed-tensors' float-quantized
checkpoints) are W8A16 instead: x is not quantized; the dense kernels widen the bytes exactly in registers
against fp32 x (bf16 x widened first) and scale each row's sum once (cpp/kernels/linear.h kDenseFp8E4M3).

    kernel = QuantLinearKernel(weight_bytes, "q4_1", K=576)   # uint8 [N, row_bytes("q4_1", 576)]
    y = kernel(x)                                              # x [M, 576] fp32 -> [M, N] fp32
    fp8 = QuantLinearKernel(w_bytes, "fp8_e4m3", K=576, scales=s)  # uint8 [N, 576], fp32 s [N]
"""

from __future__ import annotations

import torch

from pagedcore import _core
from pagedcore.ops.dtypes import CPU_DTYPE_CODES
from pagedcore.ops.linear import explain_bad_x
from pagedcore.ops.linear_isa import isa_code

__all__ = ["FP8_FORMATS", "GGUF_FORMATS", "INT8_FORMAT", "INT8_FORMATS", "QUANT_FORMATS", "SCALED_FORMATS",
           "X16_FORMATS", "QuantLinearKernel", "block_size", "row_bytes", "quantize_int8_per_channel"]

GGUF_FORMATS = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k")
INT8_FORMAT = "int8_per_channel"
# GGUF blocks (and int8 rows) repacked at load, 16 weight rows interleaved (ops/quant_repack.py): the same
# bytes, but for the k-quants' 6-bit scales unpacked to bytes (q4_kx16, q5_kx16: 4 more bytes per 256 weights).
X16_FORMATS = ("q4_0x16", "q4_1x16", "q5_0x16", "q5_1x16", "q8_0x16", "q4_kx16", "q5_kx16", "q6_kx16",
               "int8_per_channelx16")
INT8_FORMATS = (INT8_FORMAT, "int8_per_channelx16")  # int8 [N, K] weights with fp32 scales [N]
# OCP e4m3 bytes uint8 [N, K] with fp32 scales [N] (W8A16: x stays float), as stored or in the x16 layout
# [N/16][K][16] (ops/quant_repack.py; the tensor keeps its [N, K] shape).
FP8_FORMATS = ("fp8_e4m3", "fp8_e4m3x16")
SCALED_FORMATS = INT8_FORMATS + FP8_FORMATS  # the formats whose kernels take `scales`
QUANT_FORMATS = GGUF_FORMATS + (INT8_FORMAT,) + X16_FORMATS + FP8_FORMATS

# Weights per block along K and bytes per block (ggml's block_q8_0, block_q4_0, ... sizes).
_BLOCKS = {"q8_0": (32, 34), "q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24),
           "q5_0x16": (32, 22), "q5_1x16": (32, 24), "q4_k": (256, 144), "q5_k": (256, 176),
           "q6_k": (256, 210), INT8_FORMAT: (1, 1), "q4_0x16": (32, 18), "q4_1x16": (32, 20), "q8_0x16": (32, 34),
           "q4_kx16": (256, 148), "q5_kx16": (256, 180), "q6_kx16": (256, 210), "int8_per_channelx16": (4, 4),
           "fp8_e4m3": (1, 1), "fp8_e4m3x16": (1, 1)}
# Format name -> the kernel enum (cpp/kernels/linear.h WeightFormat).
FORMAT_ENUMS = {"q8_0": _core.WeightFormat.Q8_0, "q4_0": _core.WeightFormat.Q4_0, "q4_1": _core.WeightFormat.Q4_1,
          "q4_k": _core.WeightFormat.Q4_K, "q5_k": _core.WeightFormat.Q5_K, "q6_k": _core.WeightFormat.Q6_K,
          INT8_FORMAT: _core.WeightFormat.INT8_PER_CHANNEL, "q4_0x16": _core.WeightFormat.Q4_0X16,
          "q4_1x16": _core.WeightFormat.Q4_1X16, "q8_0x16": _core.WeightFormat.Q8_0X16,
          "q4_kx16": _core.WeightFormat.Q4_KX16, "q5_kx16": _core.WeightFormat.Q5_KX16,
          "q6_kx16": _core.WeightFormat.Q6_KX16, "int8_per_channelx16": _core.WeightFormat.INT8_PER_CHANNEL_X16,
          "fp8_e4m3": _core.WeightFormat.FP8_E4M3, "fp8_e4m3x16": _core.WeightFormat.FP8_E4M3X16,
          "q5_0": _core.WeightFormat.Q5_0, "q5_1": _core.WeightFormat.Q5_1, "q5_0x16": _core.WeightFormat.Q5_0X16,
          "q5_1x16": _core.WeightFormat.Q5_1X16}
_EPILOGUE_NONE, _EPILOGUE_SILU_MUL = 0, 1


def _check_format(fmt: str) -> str:
    if fmt not in _BLOCKS:
        raise ValueError(f"unknown quantized weight format {fmt!r}; the kernels take {', '.join(QUANT_FORMATS)}")
    return fmt


def block_size(fmt: str) -> int:
    """Weights per block along K: 32 (q8_0, q4_0, q4_1, q5_0, q5_1), 256 (q4_k, q5_k, q6_k), 1 (int8_per_channel,
    fp8)."""
    return _BLOCKS[_check_format(fmt)][0]


def row_bytes(fmt: str, K: int) -> int:
    """Bytes of one weight row of K weights in `fmt` (K a multiple of block_size(fmt))."""
    block, nbytes = _BLOCKS[_check_format(fmt)]
    if K < 0 or K % block:
        raise ValueError(f"{fmt} weights come in blocks of {block} along K; K = {K} is not a multiple")
    return K // block * nbytes


def quantize_int8_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output row: w [N, K] (any float dtype) -> (int8 [N, K], fp32 scales [N]) with
    w ~ q * scale[:, None], scale = max|w[n]| / 127 (1 for an all-zero row), q = round(w / scale)."""
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise ValueError("quantize_int8_per_channel takes a floating-point weight [out_features, in_features]")
    w32 = w.detach().to(torch.float32)
    amax = w32.abs().amax(dim=1)
    scales = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(w32 / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scales.contiguous()


class QuantLinearKernel:
    """One layer's quantized weight (and bias) bound to the kernel; call with x [M, K] (2-D, unit last
    stride, dtype x_dtype, CPU) -> new [M, N] (silu_mul: [M, N // 2]) of out_dtype (default x_dtype).

    weight: uint8 [N, row_bytes(fmt, K)] for a GGUF format (ggml's bytes), int8 [N, K] with fp32
    `scales` [N] for int8_per_channel, uint8 [N, K] e4m3 bytes (or a float8_e4m3fn tensor, read as its
    bytes) with fp32 `scales` [N] for fp8_e4m3 (x16: N a multiple of 16, silu_mul halves too). fp8_e4m3x16 with
    block-wise scales (block_k: inputs per scale block, a multiple of 4): `scales` fp32 [N / 16, ceil(K / block_k)],
    one per 16-row group and k-block (a checkpoint's 128 x 128 table repeated for its groups). The tensors must
    stay where they are (`matches`)."""

    __slots__ = ("weight", "scales", "bias", "weight_format", "N", "K", "out_cols", "x_dtype", "out_dtype",
                 "block_k", "weight_ptr", "_handle")

    def __init__(self, weight: torch.Tensor, weight_format: str, K: int, bias: torch.Tensor | None = None, *,
                 scales: torch.Tensor | None = None, silu_mul: bool = False, x_dtype: torch.dtype = torch.float32,
                 out_dtype: torch.dtype | None = None, isa: str = "auto", block_k: int | None = None):
        fmt = _check_format(weight_format)
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
        if fmt in FP8_FORMATS and weight.dtype is torch.float8_e4m3fn:
            weight = weight.view(torch.uint8)  # (the same bytes; matches() compares the address)
        if not isinstance(K, int) or K <= 0:
            raise ValueError(f"K must be a positive int, got {K!r}")
        nbytes = row_bytes(fmt, K)
        want = torch.int8 if fmt in INT8_FORMATS else torch.uint8
        if weight.dtype != want:
            raise TypeError(f"a {fmt} weight is {want} [N, {nbytes}]; got {weight.dtype}")
        if weight.device.type != "cpu" or weight.dim() != 2 or weight.shape[1] != nbytes:
            raise ValueError(f"a {fmt} weight with K = {K} is a CPU tensor [N, {nbytes}]; got "
                             f"{tuple(weight.shape)} on {weight.device}")
        if not weight.is_contiguous():
            raise ValueError("weight must be contiguous (call weight.contiguous() once at load)")
        N = weight.shape[0]
        if silu_mul and N % 2:
            raise ValueError(f"silu_mul needs an even number of weight rows (gate rows then up rows); got {N}")
        if fmt == "fp8_e4m3x16" and (N % 16 or (silu_mul and N // 2 % 16)):
            raise ValueError(f"{fmt} holds whole groups of 16 rows{' per SwiGLU half' if silu_mul else ''}; N = {N} "
                             "is not: keep the rows as fp8_e4m3 (quant_repack.repackable says when to repack)")
        if block_k is not None:
            if fmt != "fp8_e4m3x16" or not isinstance(block_k, int) or block_k <= 0 or block_k % 4:
                raise ValueError(f"block-wise scales (block_k {block_k!r}) go with fp8_e4m3x16 weights and a positive "
                                 f"block_k that is a multiple of 4; got {fmt}: repack the fp8 rows (quant_repack)")
            shape = (N // 16, -(-K // block_k))
            if (not isinstance(scales, torch.Tensor) or scales.dtype != torch.float32 or scales.shape != shape
                    or scales.device.type != "cpu" or not scales.is_contiguous()):
                raise ValueError(f"fp8_e4m3x16 with block_k {block_k} needs scales: a contiguous fp32 CPU tensor of "
                                 f"shape {shape}, one per 16-row group and block of {block_k} inputs")
        elif fmt in SCALED_FORMATS:
            if (not isinstance(scales, torch.Tensor) or scales.dtype != torch.float32 or scales.shape != (N,)
                    or scales.device.type != "cpu" or not scales.is_contiguous()):
                raise ValueError(f"{fmt} needs scales: a contiguous fp32 CPU tensor of shape ({N},), one per "
                                 "weight row (quantize_int8_per_channel returns int8's; an fp8 checkpoint's "
                                 "weight_scale, a per-tensor one repeated per row)")
        elif scales is not None:
            raise ValueError(f"scales are for int8_per_channel only (W8A8) and fp8_e4m3 (W8A16), and their x16 "
                             f"layouts; {fmt} blocks carry their own")
        bias_code = 0
        if bias is not None:
            if not isinstance(bias, torch.Tensor) or bias.dtype not in CPU_DTYPE_CODES:
                raise TypeError("bias must be a float32 or bfloat16 torch.Tensor or None")
            if bias.device.type != "cpu" or bias.shape != (N,) or not bias.is_contiguous():
                raise ValueError(f"bias must be a contiguous CPU tensor of shape ({N},); got "
                                 f"{tuple(bias.shape)} on {bias.device}")
            bias_code = CPU_DTYPE_CODES[bias.dtype]
        out_dtype = out_dtype or x_dtype
        for name, dtype in (("x_dtype", x_dtype), ("out_dtype", out_dtype)):
            if dtype not in CPU_DTYPE_CODES:
                raise TypeError(f"{name} {dtype} is not supported; use torch.float32 or torch.bfloat16")
        self.weight, self.scales, self.bias, self.weight_format = weight, scales, bias, fmt
        self.N, self.K = N, K
        self.out_cols = N // 2 if silu_mul else N
        self.x_dtype, self.out_dtype = x_dtype, out_dtype
        self.block_k = block_k
        self.weight_ptr = weight.data_ptr()
        per_row = scales is not None and block_k is None
        self._handle = _core.LinearHandle(
            weight=self.weight_ptr, bias=bias.data_ptr() if bias is not None else 0, N=N, K=K,
            x_dtype=CPU_DTYPE_CODES[x_dtype], weight_format=FORMAT_ENUMS[fmt], bias_dtype=bias_code,
            out_dtype=CPU_DTYPE_CODES[out_dtype], epilogue=_EPILOGUE_SILU_MUL if silu_mul else _EPILOGUE_NONE,
            isa=isa_code(isa), weight_scales=scales.data_ptr() if per_row else 0,
            weight_block_scales=scales.data_ptr() if block_k is not None else 0, weight_block_k=block_k or 0)

    def matches(self, weight: torch.Tensor) -> bool:
        """Still bound to this weight's memory (False after e.g. module.to() replaced it)."""
        return weight.data_ptr() == self.weight_ptr

    @property
    def handle(self):
        """The bound _core.LinearHandle (for C++ callers such as _core.GreedyDecoder)."""
        return self._handle

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        try:
            shape = x.shape
            ok = (x.dtype is self.x_dtype and len(shape) == 2 and shape[1] == self.K and x.is_cpu
                  and x.stride(1) == 1)
        except AttributeError:
            ok = False
        if not ok:
            self._explain(x)
        M = shape[0]
        out = torch.empty(M, self.out_cols, dtype=self.out_dtype)
        self._handle(out.data_ptr(), x.data_ptr(), M, x.stride(0), self.out_cols)
        return out

    def _explain(self, x) -> None:
        explain_bad_x(x, self.x_dtype, self.K, "the quantized linear kernel")
