"""FP8 checkpoints (an HF folder whose weights are OCP fp8 e4m3 with fp32 scales) loaded into the fp8 weight
kernels and kept as stored: one byte a weight, the checkpoint's own values and scales. Two configs write them:

    quant_method "fp8"                 (vLLM's fp8 serialization, transformers' FP8 models)
        weight            float8_e4m3fn [N, K]
        weight_scale      fp32 [] / [1]: one scale for the tensor (vLLM's per-tensor checkpoints)
        weight_scale_inv  fp32 [ceil(N / bn), ceil(K / bk)] with weight_block_size [bn, bk] (DeepSeek-V3, Qwen3
                          FP8: [128, 128]; multiplied in, despite its name)
        input_scale       fp32 [] / [1]: activation_scheme "static" only
    quant_method "compressed-tensors", format "float-quantized"  (llm-compressor's FP8 / FP8_DYNAMIC / FP8_BLOCK)
        weight        float8_e4m3fn [N, K]
        weight_scale  [N, 1] (strategy "channel"), [1] / [] ("tensor") or [ceil(N / bn), ceil(K / bk)] ("block",
                      block_structure [bn, bk]), any float dtype
        input_scale   static activations only

    W[n, k] = scale[n] * fp8(weight[n, k])                  (a tensor scale is every row's)
    W[n, k] = scale[n // bn][k // bk] * fp8(weight[n, k])   (block-wise)

Each quantized layer becomes one Fp8Weight: the stored bytes and one fp32 scale per output row (exact: a bf16 or
fp16 scale widens exactly; a q / k / v or gate / up shard keeps its own scale in the fused layer's rows), or its
block scales per 16-row group (bn a multiple of 16, bk of 4; run by the x16 kernel, which scales each k-block's
sum as it ends: cpp/kernels/linear.h).

Activations: the checkpoints declare fp8 activations (dynamic per token or per group of 128, or static per
tensor with input_scale); the CPU has no fp8 arithmetic, so the layers run weight-only (W8A16: fp32 or bf16
activations against the widened fp8 weights), as vLLM does on GPUs without fp8 compute. The input scales are then
not used (dropped at load). Refused with the fix: e5m2 weights, group scales, kv-cache scales, quantized output
activations, blocks whose rows are not a multiple of 16 or inputs of 4.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import torch

from pagedcore.loader.errors import ModelLoadError
from pagedcore.loader.gptq_awq_checkpoint import materialize

logger = logging.getLogger(__name__)

FP8 = "fp8"  # vLLM's quant_method and --quantization name
FP8_MAX = 448.0  # the largest finite e4m3 value
_SCALE_PARTS = ("weight_scale", "weight_scale_inv")
_INPUT_PARTS = ("input_scale",)
_KV_PARTS = ("k_scale", "v_scale", "kv_scale")
_SUPPORTED = ("pagedcore runs fp8 (e4m3) weights with one scale per tensor, per output channel or per block, "
              "weight-only (fp32 or bf16 activations)")


@dataclasses.dataclass(frozen=True)
class Fp8Scheme:
    method: str  # "fp8" | "compressed-tensors": the quant_method (and the layers' method name)
    static_activations: bool  # the checkpoint has input_scale tensors (dropped: the layers run weight-only)
    block_size: tuple[int, int] | None = None  # (rows, inputs) per scale block (weight_block_size), else None

    def convert(self, weights: Iterator[tuple[str, Any]], path: str) -> Iterator[tuple[str, Any]]:
        return fp8_weights(weights, self, path)


def fp8_scheme(quantization_config: dict[str, Any], path: str) -> Fp8Scheme:
    """The scheme of a quant_method "fp8" quantization_config; what the kernels cannot run is refused."""
    qc = quantization_config
    fmt = str(qc.get("fmt", "e4m3")).lower()
    if fmt != "e4m3":
        raise ModelLoadError(f"{path}: fp8 weights in format {fmt!r}; {_SUPPORTED}: use an e4m3 checkpoint")
    block_size = _block_size(qc.get("weight_block_size"), path) if qc.get("weight_block_size") else None
    if qc.get("kv_cache_scheme") or qc.get("kv_cache_quant_algo"):
        raise ModelLoadError(f"{path}: the checkpoint has quantized kv-cache scales, which pagedcore does not "
                             f"apply (use --kv-cache-dtype instead); {_SUPPORTED}")
    scheme = str(qc.get("activation_scheme", "dynamic")).lower()
    if scheme not in ("dynamic", "static"):
        raise ModelLoadError(f"{path}: activation_scheme {scheme!r}; fp8 checkpoints have 'dynamic' or 'static'")
    _log_weight_only(path)
    return Fp8Scheme(FP8, static_activations=scheme == "static", block_size=block_size)


def compressed_tensors_fp8_scheme(group: dict[str, Any], path: str, method: str) -> Fp8Scheme:
    """The scheme of a compressed-tensors "float-quantized" config group (checked by the caller for the
    settings every compressed-tensors scheme shares: sparsity, transforms, kv-cache, output activations)."""
    w = group.get("weights") or {}
    strategy = str(w.get("strategy") or "tensor").lower()
    if str(w.get("type")).lower() != "float" or w.get("num_bits") != 8:
        raise ModelLoadError(f"{path}: float-quantized weights of type {w.get('type')} and {w.get('num_bits')} "
                             f"bits (fp4 runs on GPUs); {_SUPPORTED}")
    block_size = _block_size(w.get("block_structure"), path) if strategy == "block" else None
    if strategy not in ("channel", "tensor", "block"):
        raise ModelLoadError(f"{path}: fp8 weights with {strategy!r} scales (block_structure "
                             f"{w.get('block_structure')}, group_size {w.get('group_size')}) are not supported; "
                             f"{_SUPPORTED}: use an FP8 or FP8_DYNAMIC checkpoint, or the model's bf16 weights "
                             "with --quantization fp8")
    if not bool(w.get("symmetric", True)):
        raise ModelLoadError(f"{path}: asymmetric fp8 weights; {_SUPPORTED}, symmetric")
    a = group.get("input_activations") or {}
    if a and str(a.get("type", "float")).lower() != "float":
        raise ModelLoadError(f"{path}: fp8 weights with {a.get('type')} {a.get('num_bits')}-bit activations; "
                             f"{_SUPPORTED}")
    _log_weight_only(path)
    return Fp8Scheme(method, static_activations=bool(a) and a.get("dynamic") is False, block_size=block_size)


def _block_size(block: Any, path: str) -> tuple[int, int]:
    """A checkpoint's [rows, inputs] per scale block, checked against what the x16 kernel groups: rows a multiple
    of 16 (its row groups), inputs a multiple of 4 (its k steps)."""
    if not isinstance(block, (list, tuple)) or len(block) != 2 or not all(isinstance(b, int) and b > 0 for b in block):
        raise ModelLoadError(f"{path}: fp8 block size {block!r}; expected [rows, inputs], e.g. [128, 128]")
    bn, bk = block
    if bn % 16 or bk % 4:
        raise ModelLoadError(f"{path}: fp8 scale blocks of {bn} rows x {bk} inputs; {_SUPPORTED}, and block-wise "
                             "scales on blocks whose rows are a multiple of 16 and inputs a multiple of 4 (128 x 128)")
    return bn, bk


def _log_weight_only(path: str) -> None:
    logger.info("%s: fp8 weights run weight-only (W8A16): the CPU has no fp8 arithmetic, so activations stay "
                "float32 and the checkpoint's activation quantization is not applied", path)


class Fp8Weight:
    """One linear weight [N, K] of e4m3 bytes with one fp32 scale per output row, or with block-wise scales (a
    LazyWeight for the layers): fp8_rows() gives the kernel's operands as stored, load_into the exact dequantised
    values. Block-wise (block_size (bn, bk), DeepSeek / Qwen3 FP8's 128 x 128): the checkpoint's table
    [ceil(N / bn), ceil(K / bk)] is held per 16-row group, [N / 16, ceil(K / bk)] (each block's scale repeated for its
    bn / 16 groups), so a fused layer's shards and a tensor-parallel rank's rows cut on any group; N and bn are then
    multiples of 16 (the x16 kernel's groups), bk a multiple of 4."""

    block_format = None  # not GGUF blocks: QuantLinearMethod takes fp8_rows()

    def __init__(self, name: str, values: torch.Tensor, scales: torch.Tensor,
                 block_size: tuple[int, int] | None = None, *, grouped: bool = False):
        if values.dtype != torch.float8_e4m3fn or values.dim() != 2:
            raise ModelLoadError(f"{name}: an fp8 e4m3 [out, in] weight was expected, got {values.dtype} "
                                 f"{tuple(values.shape)}; {_SUPPORTED}")
        N, K = values.shape
        self.block_k = None if block_size is None else int(block_size[1])
        if block_size is None:
            if scales.numel() == 1:
                scales = scales.reshape(1).expand(N)  # a tensor scale: every row's
            if scales.numel() != N or (scales.dim() == 2 and scales.shape[1] != 1):
                raise ModelLoadError(f"{name}: weight_scale {tuple(scales.shape)} does not fit the weight "
                                     f"{tuple(values.shape)} (one scale for the tensor or one per output row)")
            scales = scales.reshape(N).to(torch.float32)
        elif not grouped:
            scales = _scales_per_group(name, scales, N, K, block_size)
        if not bool(torch.isfinite(scales).all()):
            raise ModelLoadError(f"{name}: weight_scale holds non-finite values; re-quantize the checkpoint")
        self.name = name
        self.shape = (N, K)
        self.input_perm = None
        self._bytes = values.contiguous().view(torch.uint8)  # uint8 [N, K]: the e4m3 codes
        self._scales = scales.to(torch.float32).contiguous()  # fp32 [N], or [N / 16, KB] block-wise

    def narrow(self, dim: int, start: int, length: int) -> Fp8Weight:
        """Output rows [start, start + length) with their scales (dim 0), or those input columns of every row,
        each row keeping its scale (dim 1): a tensor-parallel rank's slice (distributed/shard_weights.py), the
        same bytes and scales the one-process model holds there. Block-wise: rows cut on 16-row groups, inputs on
        scale blocks (distributed/block_cuts.py checks the layout first)."""
        if dim not in (0, 1):
            raise ValueError(f"{self.name}: an fp8 weight is cut along dim 0 or 1, not {dim}")
        codes = self._bytes.narrow(dim, start, length).contiguous().view(torch.float8_e4m3fn)  # [rows, cols]
        if self.block_k is None:
            scales = self._scales.narrow(0, start, length) if dim == 0 else self._scales
            return Fp8Weight(self.name, codes, scales.clone())
        unit = 16 if dim == 0 else self.block_k
        if start % unit or (length % unit and start + length != self.shape[dim]):
            raise ValueError(f"{self.name}: block-scaled fp8 weights are cut on {unit}-{'row' if dim == 0 else 'input'}"
                             f" boundaries; [{start}, {start + length}) is not")
        first, count = start // unit, -(-length // unit)
        scales = self._scales.narrow(dim, first, count).clone()  # [groups, KB] of the cut
        return Fp8Weight(self.name, codes, scales, (16, self.block_k), grouped=True)

    def fp8_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(uint8 [N, K] e4m3 codes, fp32 scales: [N] per row, or [N / 16, KB] per group and k-block (block_k))."""
        return self._bytes, self._scales

    def dequantized(self) -> torch.Tensor:
        """fp32 [N, K]: scale * fp8(weight[n, k]) (the row's, or its group's and k-block's), each product rounded
        once to fp32."""
        values = self._bytes.view(torch.float8_e4m3fn).to(torch.float32)
        if self.block_k is None:
            return values * self._scales[:, None]
        N, K = self.shape
        full = self._scales.repeat_interleave(16, dim=0).repeat_interleave(self.block_k, dim=1)[:, :K]  # [N, K]
        return values * full

    def load_into(self, out: torch.Tensor) -> None:
        out.copy_(self.dequantized())


def _scales_per_group(name: str, table: torch.Tensor, N: int, K: int, block_size: tuple[int, int]) -> torch.Tensor:
    """A checkpoint's block scales [ceil(N / bn), ceil(K / bk)] -> fp32 [N / 16, ceil(K / bk)] (see Fp8Weight)."""
    bn, bk = block_size
    want = (-(-N // bn), -(-K // bk))
    if tuple(table.shape) != want:
        raise ModelLoadError(f"{name}: block-wise weight scales {tuple(table.shape)} do not fit the weight ({N}, {K}) "
                             f"in blocks of {bn} x {bk}: expected {want}")
    if N % 16:
        raise ModelLoadError(f"{name}: {N} output rows; block-scaled fp8 runs on the x16 kernel's groups of 16 rows "
                             f"(N a multiple of 16): {_SUPPORTED}")
    return table.to(torch.float32).repeat_interleave(bn // 16, dim=0)[:N // 16].contiguous()


def quantize_fp8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A dense weight [N, K] -> (uint8 [N, K] e4m3 codes, fp32 [N] scales): scale[n] = max |W[n]| / 448 (1 for a
    zero row), codes rounded to nearest even (torch's conversion); --quantization fp8 on a dense checkpoint."""
    w = weight.to(torch.float32)
    scales = w.abs().amax(dim=1) / FP8_MAX  # fp32 [N]
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = (w / scales[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)  # [N, K]
    return codes.view(torch.uint8).contiguous(), scales.contiguous()


def _is_fp8(tensor: Any) -> bool:
    if isinstance(tensor, torch.Tensor):
        return tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    return str(getattr(tensor, "dtype_name", "")).upper().startswith("F8")


def fp8_weights(weights: Iterator[tuple[str, Any]], scheme: Fp8Scheme, path: str) -> Iterator[tuple[str, Any]]:
    """The checkpoint's (name, tensor) stream with each fp8 layer's weight and weight_scale replaced by one
    (prefix + ".weight", Fp8Weight); input scales dropped (the layers run weight-only); float tensors (layers
    left unquantized, norms, embeddings) pass through. A layer is emitted once both tensors have arrived."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        prefix, _, part = name.rpartition(".")
        if part in _KV_PARTS:
            raise ModelLoadError(f"{path}: {name}: kv-cache scales, which pagedcore does not apply (use "
                                 f"--kv-cache-dtype instead); {_SUPPORTED}")
        if part in _INPUT_PARTS:
            continue  # static fp8 activation scales: unused by a weight-only layer (see the module docstring)
        if part not in _SCALE_PARTS and not (part == "weight" and _is_fp8(tensor)):
            yield name, tensor
            continue
        got = pending.setdefault(prefix, {})
        got["weight_scale" if part == "weight_scale_inv" else part] = materialize(tensor)  # (the same scale)
        if {"weight", "weight_scale"} <= got.keys():
            yield prefix + ".weight", _fp8_weight(prefix, pending.pop(prefix), scheme.block_size)
    for prefix, got in pending.items():
        missing = sorted({"weight", "weight_scale"} - got.keys())
        raise ModelLoadError(f"{path}: {prefix} has {sorted(got)} but not {missing}; the checkpoint is "
                             f"incomplete or not an fp8 checkpoint of the config's scheme")


def _fp8_weight(name: str, parts: dict[str, torch.Tensor], block_size: tuple[int, int] | None) -> Fp8Weight:
    values = parts["weight"]
    if values.dtype == torch.float8_e5m2:
        raise ModelLoadError(f"{name}: e5m2 weights; {_SUPPORTED}: use an e4m3 checkpoint")
    scales = parts["weight_scale"]
    if block_size is None and scales.dim() == 2 and scales.shape[1] > 1:
        raise ModelLoadError(f"{name}: a weight scale table {tuple(scales.shape)} in a checkpoint without block-wise "
                             "scales in its config (weight_block_size / strategy block)")
    return Fp8Weight(name, values, scales, block_size)
