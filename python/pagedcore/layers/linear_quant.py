"""Linear layers whose weights stay quantized in memory: GGUF blocks as stored, or int8 per channel.

The weight format is a property of each layer, not of the model: a GGUF file mixes block types
(Q4_K_M keeps some layers' v / down projections in Q6_K), and a fused layer (qkv, gate_up) may get
shards of different types. A layer therefore holds one or more *parts*, each a run of output rows
in one format, and runs one QuantLinearKernel per part:

    output rows  [0, q+k)            [q+k, q+k+v)        qkv_proj of a Q4_K_M layer
    part          q4_k [q+k, 144*K/256] bytes   q6_k [v, 210*K/256] bytes

Shards are loaded one at a time (in file order); a shard next to a part of the same format is
appended to it, so a layer whose shards share one format (the usual case) is one part, one tensor
(`layer.weight`), one kernel call per step.

Formats: the GGUF block formats (rows of llama.cpp's blocks, uint8 [rows, row_bytes]), int8 per
output channel (int8 [rows, in] + fp32 scales [rows], W8A8 with activations quantized per token by
the kernel), fp8 e4m3 (uint8 codes [rows, in] + fp32 scales [rows]; the kernel widens them, x stays fp32),
and "float32" for a float tensor inside a quantized GGUF (llama.cpp writes F16/F32 for
some small tensors). Activations are fp32. Every row count runs the kernel (ops/quant_linear.py):
there is no dequantised copy of any weight, so there is no GEMM fallback to pick for large steps.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.nn.functional as F
from torch import nn

from pagedcore.layers import held_weights
from pagedcore.layers.activation import silu_mul
from pagedcore.layers.linear import Linear, LinearMethod
from pagedcore.layers.weights import CheckpointTensor, copy_weight

INT8_PER_CHANNEL = "int8_per_channel"
FP8_E4M3 = "fp8_e4m3"  # the kernel format of fp8 weights (e4m3 bytes [rows, in] + fp32 scales [rows])
FP8_PER_CHANNEL = "fp8_per_channel"  # the method of --quantization fp8 on a dense checkpoint (loader/quantization.py)
_DENSE_PART = "float32"  # a float tensor of a quantized file, kept fp32 and run by torch
QUANT_MAX_ROWS = 1 << 30  # rows a quantized kernel takes in one call: any (there is no library GEMM to hand off to)


@dataclasses.dataclass
class QuantPart:
    """Output rows [row_start, row_start + num_rows) of a layer, all in one format."""

    format: str  # a kernel format ("q4_1", ..., "int8_per_channel") or "float32"
    row_start: int
    num_rows: int
    weight: torch.Tensor  # uint8 [rows, row_bytes] | int8 [rows, in] | uint8 [rows, in] (fp8) | fp32 [rows, in]
    scales: torch.Tensor | None = None  # fp32 [rows]: int8_per_channel and fp8_e4m3 only
    source_dtype: torch.dtype | None = None  # a float part's dtype in the checkpoint (bf16 / fp16: held so, dense)
    # fp8 with block-wise scales: inputs per scale block, `scales` then fp32 [rows / 16, ceil(in / block_k)]
    block_k: int | None = None
    kernels: dict = dataclasses.field(default_factory=dict)  # (silu_mul, x dtype) -> QuantLinearKernel

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes + (0 if self.scales is None else self.scales.nbytes)


class QuantLinearMethod(LinearMethod):
    """Quantized weights, kept so. format "gguf" (and "gptq" / "awq" / "compressed-tensors"): each checkpoint
    tensor keeps the format it comes in (GGUFWeight.block_format; a GroupedIntWeight's Q4_0 / Q4_1 / Q8_0; a
    ChannelInt8Weight's int8 rows); "int8_per_channel": float checkpoint tensors are quantized per output
    row at load (vLLM-style online quantization of a dense checkpoint)."""

    def __init__(self, format: str, quantize_dense_to: str | None = None, dtype: torch.dtype = torch.float32):
        self.format = format
        self.quantize_dense_to = quantize_dense_to  # None: a float tensor stays a float32 part
        # The model's activation dtype: float32, or bfloat16 for fp8 weights (loader/quantization.py allows no
        # other), where a layer the checkpoint left unquantized becomes a dense bf16 layer.
        self.dtype = dtype

    def for_dtype(self, dtype: torch.dtype) -> QuantLinearMethod:
        """This method in a model whose activations are `dtype` (itself for float32)."""
        return self if dtype is self.dtype else QuantLinearMethod(self.format, self.quantize_dense_to, dtype)

    def for_lm_head(self) -> LinearMethod:
        """--quantization fp8 leaves an untied LM head dense in the model's dtype, as vLLM's online fp8 does (it
        quantizes the decoder's linear layers only); every other method keeps its head as the checkpoint has it
        (a quantized file's) or quantizes it too (int8_per_channel, this project's own method)."""
        if self.quantize_dense_to == FP8_E4M3:
            from pagedcore.layers.linear import LINEAR_METHODS

            return LINEAR_METHODS["bfloat16" if self.dtype is torch.bfloat16 else "float32"]
        return self

    def create_weights(self, layer: Linear, bias: bool) -> None:
        # The format of each row range is known only when its checkpoint tensor arrives; until then
        # `weight` is an empty placeholder (named, so the model's load_weights finds the parameter).
        layer.weight = nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)
        layer.bias = (nn.Parameter(torch.empty(layer.out_features, dtype=torch.float32), requires_grad=False)
                      if bias else None)  # [out], fp32 like the activations
        layer.quant_parts = []  # list[QuantPart], sorted by row_start, covering the rows loaded so far
        # An act-order GPTQ layer's input order (loader/integer_weight.py): int64 [in], x[:, input_perm]
        # is what its blocks multiply; None: inputs as they come.
        layer.input_perm = None

    def load(self, layer: Linear, param_name: str, loaded: CheckpointTensor, name: str,
             rows: tuple[int, int] | None) -> None:
        start, num_rows = rows if rows is not None else (0, layer.out_features)
        if param_name == "bias":
            if layer.bias is None:
                raise ValueError(f"the checkpoint has {name!r} but this layer was built without a bias; "
                                 "check attention_bias in the config")
            copy_weight(layer.bias.data.narrow(0, start, num_rows), loaded, name)
            return
        if param_name != "weight":
            raise ValueError(f"checkpoint tensor {name!r}: a quantized linear layer ({self.format}) loads weight "
                             f"and bias, not {param_name!r}")
        if tuple(loaded.shape) != (num_rows, layer.in_features):
            raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(loaded.shape)}; the config implies "
                             f"{(num_rows, layer.in_features)}")
        input_perm = getattr(loaded, "input_perm", None)
        if layer.quant_parts and not _same_order(layer.input_perm, input_perm):
            raise ValueError(f"checkpoint tensor {name!r} has another act-order input permutation than the "
                             "shards loaded before it into the same fused layer (q/k/v or gate/up share their "
                             "input, so GPTQ gives them one order); re-quantize with desc_act=False")
        layer.input_perm = input_perm
        _insert_part(layer, self._part(loaded, name, start, num_rows, layer.in_features))

    def _part(self, loaded: CheckpointTensor, name: str, start: int, num_rows: int, in_features: int) -> QuantPart:
        if self.quantize_dense_to is not None and not _is_quantized(loaded):
            loaded = self.quantize_rows(loaded, name)  # int8 / fp8 rows and their scales, taken below
        block_format = getattr(loaded, "block_format", None)
        if block_format is not None:  # GGUF blocks, kept as stored
            return QuantPart(block_format, start, num_rows, loaded.block_rows())
        if hasattr(loaded, "int8_rows"):  # a checkpoint's int8 rows and their scales (W8A8), as stored
            values, scales = loaded.int8_rows()  # int8 [rows, in], fp32 [rows]
            return QuantPart(INT8_PER_CHANNEL, start, num_rows, values, scales)
        if hasattr(loaded, "fp8_rows"):  # a checkpoint's fp8 rows and their scales, as stored
            values, scales = loaded.fp8_rows()  # uint8 [rows, in] e4m3 codes, fp32 [rows] (or [rows / 16, KB])
            block_k = getattr(loaded, "block_k", None)
            if block_k is not None and start % 16:
                raise ValueError(f"checkpoint tensor {name!r}: block-scaled fp8 rows start at row {start} of the fused "
                                 "layer, inside a 16-row group of the x16 kernel")
            return QuantPart(FP8_E4M3, start, num_rows, values, scales, block_k=block_k)
        dense = torch.empty(num_rows, in_features, dtype=torch.float32)  # [rows, in]
        copy_weight(dense, loaded, name)
        return QuantPart(_DENSE_PART, start, num_rows, dense, source_dtype=held_weights.source_dtype(loaded))

    def quantize_rows(self, loaded: CheckpointTensor, name: str) -> CheckpointTensor:
        """A dense checkpoint tensor [N, K] quantized per output row as this method holds it: a ChannelInt8Weight
        (int8_per_channel) or an Fp8Weight (fp8 online); `loaded` itself for a method that does not quantize at
        load. A tensor-parallel rank quantizes a row-parallel tensor's whole rows before its cut (narrow), so it
        holds the one-process values (distributed/shard_weights.py)."""
        if self.quantize_dense_to is None or _is_quantized(loaded):
            return loaded
        dense = torch.empty(tuple(loaded.shape), dtype=torch.float32)  # [N, K]
        copy_weight(dense, loaded, name)
        if self.quantize_dense_to == INT8_PER_CHANNEL:
            from pagedcore.loader.integer_weight import ChannelInt8Weight
            from pagedcore.ops.quant_linear import quantize_int8_per_channel

            values, scales = quantize_int8_per_channel(dense)  # int8 [N, K], fp32 [N]
            return ChannelInt8Weight(name, values, scales)
        from pagedcore.loader.fp8_checkpoint import Fp8Weight, quantize_fp8_per_channel

        codes, scales = quantize_fp8_per_channel(dense)  # uint8 [N, K] e4m3 codes, fp32 [N]
        return Fp8Weight(name, codes.view(torch.float8_e4m3fn), scales)

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        x2 = _ordered_inputs(layer, x)  # [num_rows, in]
        parts = _loaded_parts(layer)
        if len(parts) == 1:
            y = _run_part(parts[0], layer, x2, silu_mul=False)
        else:  # a layer of several formats: each part writes its columns
            y = torch.empty(x2.shape[0], layer.out_features, dtype=layer.out_dtype or x.dtype)  # [num_rows, out]
            for part in parts:
                y[:, part.row_start:part.row_start + part.num_rows] = _run_part(part, layer, x2, silu_mul=False)
        return y.view(*x.shape[:-1], layer.out_features)

    def apply_silu_mul(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        parts = _loaded_parts(layer)
        if len(parts) == 1 and parts[0].format != _DENSE_PART:
            x2 = _ordered_inputs(layer, x)  # [num_rows, in]
            y = _run_part(parts[0], layer, x2, silu_mul=True)  # SwiGLU in the kernel's epilogue
            return y.view(*x.shape[:-1], y.shape[-1])
        gate_up = self.apply(layer, x)  # [num_tokens, out]: gate and up in different formats
        # The kernel epilogue's SwiGLU on its own (cpp/kernels/silu_mul.h): what the C++ decoder stack runs after
        # such a layer's runs, so the two paths give the same bits.
        act = silu_mul(gate_up.reshape(-1, gate_up.shape[-1]))  # [num_tokens, out / 2]
        return act.view(*gate_up.shape[:-1], act.shape[-1])

    def process_weights_after_loading(self, layer: Linear) -> None:
        """A layer that is one float tensor (a GGUF's F16 / BF16 / F32 matrix; a GPTQ / AWQ / compressed-tensors
        checkpoint's unquantized one) becomes a dense layer (_become_dense). Otherwise repacks each GGUF part
        (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) of whole 16-row groups into the x16 layout where this CPU
        has its kernel (ops/quant_repack.py: AVX2, AVX-512; Q4_1 6x the ggml layout's rate at 128 rows and 1.6x at
        one row on Zen 5, the k-quants 5x at one row), once, replacing the file's bytes (the same bytes; the
        k-quants' scales unpacked, +2.8% for Q4_K). A part of another row count keeps the file layout. PAGEDCORE_QUANT_REPACK=0
        keeps the file's layout everywhere (for A/B measurements) but for block-scaled fp8 (x16 kernel only)."""
        parts = layer.quant_parts
        if (self.format in BLOCK_METHODS and len(parts) == 1 and parts[0].format == _DENSE_PART
                and parts[0].num_rows == layer.out_features):
            _become_dense(layer, parts[0], self.dtype)
            return
        repack = os.environ.get("PAGEDCORE_QUANT_REPACK", "1") != "0"
        from pagedcore.ops.quant_repack import repack_x16, repackable

        changed = False
        for part in layer.quant_parts:
            if not repack and part.block_k is None:
                continue  # (block-scaled fp8 has only the x16 kernel: it repacks whatever the switch says)
            repacked = repackable(part.format, part.num_rows, K=layer.in_features)
            if repacked is None and part.block_k is not None:
                raise ValueError(f"a block-scaled fp8 part of {part.num_rows} rows has no x16 kernel on this CPU")
            if repacked is not None:
                part.weight = repack_x16(part.weight, part.format, layer.in_features)
                part.format, part.kernels = repacked, {}
                changed = True
        if changed and len(layer.quant_parts) == 1 and layer.quant_parts[0].num_rows == layer.out_features:
            layer.weight.data = layer.quant_parts[0].weight  # the layer's one tensor, as _insert_part keeps it

    def kernel_for(self, layer: Linear, x_dtype: torch.dtype):
        parts = layer.quant_parts
        if (layer.lora is not None or layer.input_perm is not None or len(parts) != 1
                or parts[0].num_rows != layer.out_features
                or parts[0].format == _DENSE_PART or x_dtype not in (torch.float32, torch.bfloat16)):
            return None
        return _part_kernel(parts[0], layer, x_dtype, silu_mul=False), QUANT_MAX_ROWS

    def weight_bytes(self, layer: Linear) -> dict[str, int]:
        """Resident bytes of the layer's weights by format (bias included, as float32)."""
        counts: dict[str, int] = {}
        for part in layer.quant_parts:
            fmt = part.format.removesuffix("x16")  # counted by file format (q4_kx16: its resident bytes)
            counts[fmt] = counts.get(fmt, 0) + part.nbytes
        if layer.bias is not None:
            counts["float32"] = counts.get("float32", 0) + layer.bias.nbytes
        return counts

    def formats(self, layer: Linear) -> list[str]:
        return [part.format for part in layer.quant_parts]


def _insert_part(layer: Linear, part: QuantPart) -> None:
    """Adds a loaded shard and merges it with a touching neighbour of the same format, so a layer
    of one format ends as one part; the single part's tensor becomes layer.weight."""
    parts = sorted([*layer.quant_parts, part], key=lambda p: p.row_start)
    merged: list[QuantPart] = []
    for p in parts:
        prev = merged[-1] if merged else None
        if (prev is not None and prev.format == p.format and prev.row_start + prev.num_rows == p.row_start
                and prev.block_k == p.block_k):
            scales = None if prev.scales is None else torch.cat([prev.scales, p.scales])  # (rows, or row groups)
            source_dtype = prev.source_dtype if prev.source_dtype is p.source_dtype else None  # (mixed: fp32)
            merged[-1] = QuantPart(p.format, prev.row_start, prev.num_rows + p.num_rows,
                                   torch.cat([prev.weight, p.weight]), scales, source_dtype=source_dtype,
                                   block_k=p.block_k)
        else:
            merged.append(p)
    layer.quant_parts = merged
    # One format: the bytes are the layer's `weight` (state_dict and repr see them). Several: each
    # part keeps its own tensor and `weight` stays empty (weight_bytes() counts the parts).
    single = len(merged) == 1 and merged[0].num_rows == layer.out_features
    layer.weight.data = merged[0].weight if single else torch.empty(0, dtype=torch.uint8)


def _become_dense(layer: Linear, part: QuantPart, dtype: torch.dtype = torch.float32) -> None:
    """A layer that a quantized file left unquantized (a GGUF's F16 / BF16 / F32 matrix; an HF GPTQ / AWQ /
    compressed-tensors / fp8 checkpoint's untied lm_head, `ignore`, modules_to_not_convert) becomes the dense layer
    a dense checkpoint would have: the x16 kernel where the CPU has it, a kernel binding for the one-call
    decode's head (kernel_for), the C++ decoder stack, the kernels' pool where nothing else needs torch. In an fp32
    model (`dtype`) a bf16 or fp16 tensor is held as stored (its exact values, half the bytes; a bias stays fp32) and
    multiplies the fp32 activations (the kernels widen it: the same sums as an fp32 copy); any other is held fp32.
    In a bf16 model (fp8 checkpoints) it is the dense bf16 layer. Done through the dense method's own calls."""
    from pagedcore.layers.linear import HELD_16BIT_METHODS, LINEAR_METHODS

    bias = layer.bias  # fp32 [out] (a held layer keeps it so: the checkpoint's bias need not be 16-bit)
    held = HELD_16BIT_METHODS.get(part.source_dtype) if dtype is torch.float32 else None
    dense = held or LINEAR_METHODS["bfloat16" if dtype is torch.bfloat16 else "float32"]
    layer.method = dense
    del layer.quant_parts, layer.input_perm
    dense.create_weights(layer, bias is not None)
    if held is not None and bias is not None:
        layer.bias = nn.Parameter(torch.empty_like(bias.data), requires_grad=False)  # fp32, as loaded
    # (a held part's values in its own dtype: exact, they came from it)
    dense.load(layer, "weight", part.weight if held is None else part.weight.to(held.dtype), "weight", None)
    if bias is not None:
        dense.load(layer, "bias", bias.data, "bias", None)
    dense.process_weights_after_loading(layer)


def _is_quantized(loaded: CheckpointTensor) -> bool:
    """A checkpoint tensor that arrives quantized (GGUF blocks, int8 or fp8 rows), not a float one."""
    return (getattr(loaded, "block_format", None) is not None or hasattr(loaded, "int8_rows")
            or hasattr(loaded, "fp8_rows"))


def _same_order(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


def _ordered_inputs(layer: Linear, x: torch.Tensor) -> torch.Tensor:
    """x [..., in] -> [num_rows, in], its inputs gathered into the layer's act order when it has one."""
    x2 = x.reshape(-1, layer.in_features)
    return x2 if layer.input_perm is None else x2.index_select(1, layer.input_perm)


def _loaded_parts(layer: Linear) -> list[QuantPart]:
    parts = layer.quant_parts
    if sum(p.num_rows for p in parts) != layer.out_features:
        raise RuntimeError(f"quantized linear layer ({layer.in_features} -> {layer.out_features}) has "
                           f"{sum(p.num_rows for p in parts)} rows loaded; load the checkpoint first")
    return parts


def _run_part(part: QuantPart, layer: Linear, x: torch.Tensor, silu_mul: bool) -> torch.Tensor:
    """x [num_rows, in] -> [num_rows, part rows] (or [num_rows, part rows / 2] with silu_mul)."""
    bias = None if layer.bias is None else layer.bias.narrow(0, part.row_start, part.num_rows)  # [part rows]
    if part.format == _DENSE_PART:
        y = F.linear(x, part.weight, bias)
        return y if layer.out_dtype is None else y.to(layer.out_dtype)
    if x.shape[0] == 0:
        return x.new_empty(0, part.num_rows // 2 if silu_mul else part.num_rows, dtype=layer.out_dtype or x.dtype)
    kernel = _part_kernel(part, layer, x.dtype, silu_mul)
    return kernel(x if x.is_contiguous() else x.contiguous())


def _part_kernel(part: QuantPart, layer: Linear, x_dtype: torch.dtype, silu_mul: bool):
    """The part's QuantLinearKernel for x of x_dtype (built once per (silu_mul, x_dtype), again if the
    part's tensor was replaced)."""
    key = (silu_mul, x_dtype)
    kernel = part.kernels.get(key)
    if kernel is None or not kernel.matches(part.weight):
        from pagedcore.ops.quant_linear import QuantLinearKernel

        bias = None if layer.bias is None else layer.bias.narrow(0, part.row_start, part.num_rows)  # [part rows]
        kernel = part.kernels[key] = QuantLinearKernel(
            part.weight, part.format, layer.in_features, bias, scales=part.scales, silu_mul=silu_mul,
            x_dtype=x_dtype, out_dtype=None if silu_mul else layer.out_dtype, block_k=part.block_k)
    return kernel


# Methods whose layers keep a checkpoint's quantized weights as loaded: a GGUF's blocks, or the blocks and
# int8 rows a GPTQ / AWQ / compressed-tensors checkpoint becomes at load (loader/integer_weight.py).
# An HF checkpoint's float tensors are layers it left unquantized (an untied lm_head, `ignore`): run as dense.
HF_BLOCK_METHODS = ("gptq", "awq", "compressed-tensors", "fp8")
BLOCK_METHODS = ("gguf", *HF_BLOCK_METHODS)
QUANT_LINEAR_METHODS: dict[str, LinearMethod] = {
    **{name: QuantLinearMethod(name) for name in BLOCK_METHODS},
    INT8_PER_CHANNEL: QuantLinearMethod(INT8_PER_CHANNEL, quantize_dense_to=INT8_PER_CHANNEL),
    FP8_PER_CHANNEL: QuantLinearMethod(FP8_PER_CHANNEL, quantize_dense_to=FP8_E4M3),
}
