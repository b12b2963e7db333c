"""FP8 checkpoints (an HF folder whose weights are OCP fp8 e4m3 with fp32 scales) loaded into the fp8 weight
kernels and kept as stored: one byte a weight, the checkpoint's own values and scales. Two configs write them:

    quant_method "fp8"                 (vLLM's fp8 serialization, transformers' FP8 models)
        weight        float8_e4m3fn [N, K]
        weight_scale  fp32 [] / [1]: one scale for the tensor (vLLM's per-tensor checkpoints)
        input_scale   fp32 [] / [1]: activation_scheme "static" only
    quant_method "compressed-tensors", format "float-quantized"  (llm-compressor's FP8 / FP8_DYNAMIC schemes)
        weight        float8_e4m3fn [N, K]
        weight_scale  [N, 1] (strategy "channel") or [1] / [] ("tensor"), any float dtype
        input_scale   static activations only

    W[n, k] = scale[n] * fp8(weight[n, k])      (a tensor scale is every row's)

Each quantized layer becomes one Fp8Weight: the stored bytes and one fp32 scale per output row (exact: a bf16 or
fp16 scale widens exactly; a q / k / v or gate / up shard keeps its own scale in the fused layer's rows).

Activations: the checkpoints declare fp8 activations (dynamic per token, or static per tensor with input_scale);
the CPU has no fp8 arithmetic, so the layers run weight-only (W8A16: fp32 activations against the widened fp8
weights), as vLLM does on GPUs without fp8 compute. The input scales are then not used (dropped at load).
Refused with the fix: e5m2 weights, block-wise scales (weight_block_size, strategy "block"), group scales,
kv-cache scales, quantized output activations.
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
_SUPPORTED = ("pagedcore runs fp8 (e4m3) weights with one scale per tensor or per output channel, weight-only "
              "(fp32 activations)")


@dataclasses.dataclass(frozen=True)
class Fp8Scheme:
    method: str  # "fp8" | "compressed-tensors": the quant_method (and the layers' method name)
    static_activations: bool  # the checkpoint has input_scale tensors (dropped: the layers run weight-only)

    def convert(self, weights: Iterator[tuple[str, Any]], path: str) -> Iterator[tuple[str, Any]]:
        return fp8_weights(weights, self, path)


def fp8_scheme(quantization_config: dict[str, Any], path: str) -> Fp8Scheme:
    """The scheme of a quant_method "fp8" quantization_config; what the kernels cannot run is refused."""
    qc = quantization_config
    fmt = str(qc.get("fmt", "e4m3")).lower()
    if fmt != "e4m3":
        raise ModelLoadError(f"{path}: fp8 weights in format {fmt!r}; {_SUPPORTED}: use an e4m3 checkpoint")
    if qc.get("weight_block_size"):
        raise ModelLoadError(f"{path}: fp8 weights with block-wise scales (weight_block_size "
                             f"{qc.get('weight_block_size')}) are not supported; {_SUPPORTED}: use a per-tensor "
                             "or per-channel FP8 checkpoint, the model's GGUF, or its bf16 weights with "
                             "--quantization fp8 (quantized at load)")
    if qc.get("kv_cache_scheme") or qc.get("kv_cache_quant_algo"):
        raise ModelLoadError(f"{path}: the checkpoint has quantized kv-cache scales, which pagedcore does not "
                             f"apply (use --kv-cache-dtype instead); {_SUPPORTED}")
    scheme = str(qc.get("activation_scheme", "dynamic")).lower()
    if scheme not in ("dynamic", "static"):
        raise ModelLoadError(f"{path}: activation_scheme {scheme!r}; fp8 checkpoints have 'dynamic' or 'static'")
    _log_weight_only(path)
    return Fp8Scheme(FP8, static_activations=scheme == "static")


def compressed_tensors_fp8_scheme(group: dict[str, Any], path: str, method: str) -> Fp8Scheme:
    """The scheme of a compressed-tensors "float-quantized" config group (checked by the caller for the
    settings every compressed-tensors scheme shares: sparsity, transforms, kv-cache, output activations)."""
    w = group.get("weights") or {}
    strategy = str(w.get("strategy") or "tensor").lower()
    if str(w.get("type")).lower() != "float" or w.get("num_bits") != 8:
        raise ModelLoadError(f"{path}: float-quantized weights of type {w.get('type')} and {w.get('num_bits')} "
                             f"bits (fp4 runs on GPUs); {_SUPPORTED}")
    if strategy not in ("channel", "tensor"):
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
    return Fp8Scheme(method, static_activations=bool(a) and a.get("dynamic") is False)


def _log_weight_only(path: str) -> None:
    logger.info("%s: fp8 weights run weight-only (W8A16): the CPU has no fp8 arithmetic, so activations stay "
                "float32 and the checkpoint's activation quantization is not applied", path)


class Fp8Weight:
    """One linear weight [N, K] of e4m3 bytes with one fp32 scale per output row (a LazyWeight for the
    layers): fp8_rows() gives the kernel's operands as stored, load_into the exact dequantised values."""

    block_format = None  # not GGUF blocks: QuantLinearMethod takes fp8_rows()

    def __init__(self, name: str, values: torch.Tensor, scales: torch.Tensor):
        if values.dtype != torch.float8_e4m3fn or values.dim() != 2:
            raise ModelLoadError(f"{name}: an fp8 e4m3 [out, in] weight was expected, got {values.dtype} "
                                 f"{tuple(values.shape)}; {_SUPPORTED}")
        N = values.shape[0]
        if scales.numel() == 1:
            scales = scales.reshape(1).expand(N)  # a tensor scale: every row's
        if scales.numel() != N or (scales.dim() == 2 and scales.shape[1] != 1):
            raise ModelLoadError(f"{name}: weight_scale {tuple(scales.shape)} does not fit the weight "
                                 f"{tuple(values.shape)} (one scale for the tensor or one per output row)")
        scales = scales.reshape(N).to(torch.float32)
        if not bool(torch.isfinite(scales).all()):
            raise ModelLoadError(f"{name}: weight_scale holds non-finite values; re-quantize the checkpoint")
        self.name = name
        self.shape = tuple(values.shape)
        self.input_perm = None
        self._bytes = values.contiguous().view(torch.uint8)  # uint8 [N, K]: the e4m3 codes
        self._scales = scales.contiguous()  # fp32 [N]

    def narrow(self, dim: int, start: int, length: int) -> Fp8Weight:
        """Output rows [start, start + length) with their scales (dim 0), or those input columns of every row,
        each row keeping its scale (dim 1): a tensor-parallel rank's slice (distributed/shard_weights.py), the
        same bytes and scales the one-process model holds there."""
        if dim not in (0, 1):
            raise ValueError(f"{self.name}: an fp8 weight is cut along dim 0 or 1, not {dim}")
        codes = self._bytes.narrow(dim, start, length).contiguous()  # uint8
        scales = self._scales.narrow(0, start, length) if dim == 0 else self._scales
        return Fp8Weight(self.name, codes.view(torch.float8_e4m3fn), scales.clone())

    def fp8_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(uint8 [N, K] e4m3 codes, fp32 [N] scales)."""
        return self._bytes, self._scales

    def dequantized(self) -> torch.Tensor:
        """fp32 [N, K]: scale[n] * fp8(weight[n, k]), each product rounded once to fp32."""
        return self._bytes.view(torch.float8_e4m3fn).to(torch.float32) * self._scales[:, None]

    def load_into(self, out: torch.Tensor) -> None:
        out.copy_(self.dequantized())


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
        if part == "weight_scale_inv":
            raise ModelLoadError(f"{path}: {name}: block-wise fp8 scales are not supported; {_SUPPORTED}")
        got = pending.setdefault(prefix, {})
        got[part] = materialize(tensor)
        if {"weight", "weight_scale"} <= got.keys():
            yield prefix + ".weight", _fp8_weight(prefix, pending.pop(prefix))
    for prefix, got in pending.items():
        missing = sorted({"weight", "weight_scale"} - got.keys())
        raise ModelLoadError(f"{path}: {prefix} has {sorted(got)} but not {missing}; the checkpoint is "
                             f"incomplete or not an fp8 checkpoint of the config's scheme")


def _fp8_weight(name: str, parts: dict[str, torch.Tensor]) -> Fp8Weight:
    values = parts["weight"]
    if values.dtype == torch.float8_e5m2:
        raise ModelLoadError(f"{name}: e5m2 weights; {_SUPPORTED}: use an e4m3 checkpoint")
    return Fp8Weight(name, values, parts["weight_scale"])
