"""compressed-tensors checkpoints (llm-compressor's format: config.json quant_method "compressed-tensors",
what vLLM users deploy as "quantized.w8a8" / "quantized.w4a16" models) loaded into the block and int8
kernels, kept quantized. What such a checkpoint holds for a quantized linear layer W [N, K]:

    format "pack-quantized"   weight_packed int32 [N, K*b/32]: field i (bits bi..) of [n, c] = q[n, (32/b) c + i]
                              + 2^(b-1) (signed q stored unsigned); weight_shape int [2] = (N, K)
    format "naive-quantized"  weight int8 [N, K]: q as signed integers
      / "int-quantized"
    both                      weight_scale [N, G] (group), [N, 1] (channel) or [1] (tensor), any float dtype;
                              weight_zero_point (asymmetric only): packed along N, int32 [N*b/32, G]
                              (pack-quantized) or int8 [N, G]; weight_g_idx int [K] (actorder "group")
                              W[n, k] = scale[n, g] * (q[n, k] - zero[n, g]),  g = g_idx[k] or k // group_size

What runs (integer_weight.py holds the conversions; every one is exact but Q4_1's fp16 minimum):
    8-bit weights, channel / tensor scales, symmetric, activations int8 dynamic per token, symmetric (W8A8)
        -> int8_per_channel: the W8A8 kernel, per-token activation scales, as the checkpoint defines them
    8-bit weight-only (W8A16), symmetric, any group size a multiple of 32 -> Q8_0 blocks
    4-bit weight-only (W4A16), symmetric -> Q4_0; asymmetric -> Q4_1
    format "float-quantized": fp8 e4m3 weights, channel / tensor / block scales (llm-compressor's FP8,
        FP8_DYNAMIC, FP8_BLOCK) -> fp8_e4m3 rows, as stored, run weight-only (loader/fp8_checkpoint.py)
The weight-only integer schemes run on the block kernels, which quantize activations to int8 per block of 32
(as for a GGUF or a GPTQ checkpoint): not the checkpoint's 16-bit activations; docs/quantization.md says so.
Layers the checkpoint leaves unquantized (`ignore`: lm_head, ...) are dense. Refused with the fix: nvfp4 /
mxfp4, group-scaled fp8, sparse and 2:4 formats, transforms, kv-cache scales, static or per-tensor int8
activation scales, asymmetric activations, W4A8, a config whose groups differ, block strategies, 8-bit
asymmetric weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from pagedcore.loader.errors import ModelLoadError
from pagedcore.loader.fp8_checkpoint import Fp8Scheme, compressed_tensors_fp8_scheme
from pagedcore.loader.gptq_awq_checkpoint import materialize
from pagedcore.loader.integer_weight import BLOCK, ChannelInt8Weight, GroupedIntWeight, sorted_by_group

METHOD = "compressed-tensors"
_FORMATS = ("pack-quantized", "naive-quantized", "int-quantized")
FLOAT_FORMAT = "float-quantized"  # fp8 weights: loader/fp8_checkpoint.py
_PARTS = ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point", "weight_g_idx")
_SUPPORTED = ("pagedcore runs compressed-tensors int8 W8A8 (channel weights, dynamic per-token activations), "
              "weight-only int4 / int8 (W4A16, W8A16; pack- or naive-quantized) and fp8 weights with channel or "
              "tensor scales (float-quantized, run weight-only)")


@dataclasses.dataclass(frozen=True)
class CompressedTensorsScheme:
    format: str  # one of _FORMATS
    bits: int  # 4 | 8
    strategy: str  # "group" | "channel" | "tensor"
    group_size: int | None  # inputs per group (strategy "group")
    symmetric: bool
    w8a8: bool  # activations quantized int8 per token, dynamically (the int8_per_channel kernel)
    act_order: bool = False  # actorder "group": each layer has weight_g_idx
    method: str = METHOD

    def convert(self, weights: Iterator[tuple[str, Any]], path: str) -> Iterator[tuple[str, Any]]:
        return compressed_tensors_weights(weights, self, path)


def compressed_tensors_scheme(quantization_config: dict[str, Any], path: str) -> CompressedTensorsScheme | Fp8Scheme:
    """The scheme of a compressed-tensors quantization_config; what the kernels cannot run is refused."""
    qc = quantization_config
    groups = list((qc.get("config_groups") or {}).values())
    if not groups:
        raise ModelLoadError(f"{path}: a compressed-tensors quantization_config without config_groups")
    first = groups[0]
    for other in groups[1:]:
        if any(other.get(key) != first.get(key) for key in ("weights", "input_activations", "output_activations")):
            raise ModelLoadError(f"{path}: compressed-tensors config_groups with different schemes (mixed "
                                 f"precision) are not supported; {_SUPPORTED}, one scheme for every layer")
    fmt = str(first.get("format") or qc.get("format") or "").lower()
    if fmt not in (*_FORMATS, FLOAT_FORMAT):
        raise ModelLoadError(f"{path}: compressed-tensors format {fmt!r} is not supported (fp4 weights, sparse "
                             f"and 2:4 formats run on GPUs); {_SUPPORTED}: use such a checkpoint, the model's "
                             "GGUF, or its unquantized weights (with --quantization int8_per_channel or fp8)")
    sparsity = qc.get("sparsity_config") or {}
    if sparsity and str(sparsity.get("format", "dense")).lower() != "dense":
        raise ModelLoadError(f"{path}: a sparse compressed-tensors checkpoint ({sparsity.get('format')}); "
                             f"{_SUPPORTED}, dense")
    for key, what in (("transform_config", "rotation transforms (SpinQuant / QuIP)"),
                      ("kv_cache_scheme", "quantized kv-cache scales (use --kv-cache-dtype instead)")):
        if qc.get(key):
            raise ModelLoadError(f"{path}: the checkpoint has {what}, which pagedcore does not apply; "
                                 f"{_SUPPORTED}, without {key}")
    if first.get("output_activations"):
        raise ModelLoadError(f"{path}: quantized output activations are not supported; {_SUPPORTED}")
    if fmt == FLOAT_FORMAT:  # fp8 weights (llm-compressor's FP8 / FP8_DYNAMIC): the fp8 kernels
        return compressed_tensors_fp8_scheme(first, path, METHOD)
    w = first.get("weights") or {}
    bits, strategy = w.get("num_bits"), str(w.get("strategy") or "tensor").lower()
    group_size, symmetric = w.get("group_size"), bool(w.get("symmetric", True))
    if str(w.get("type", "int")).lower() != "int" or bits not in (4, 8):
        raise ModelLoadError(f"{path}: {w.get('type')} weights of {bits} bits; {_SUPPORTED}")
    if strategy not in ("group", "channel", "tensor"):
        raise ModelLoadError(f"{path}: weight strategy {strategy!r}; {_SUPPORTED} with group, channel or "
                             "tensor scales")
    if strategy == "group" and not (isinstance(group_size, int) and group_size > 0 and group_size % BLOCK == 0):
        raise ModelLoadError(f"{path}: group_size={group_size!r}; the block kernels need groups of a multiple "
                             f"of {BLOCK} inputs (32, 64, 128, ...)")
    if bits == 8 and not symmetric:
        raise ModelLoadError(f"{path}: asymmetric 8-bit weights; the int8 and Q8_0 kernels hold symmetric ones: "
                             "use a symmetric checkpoint, a 4-bit one, or the model's GGUF")
    a = first.get("input_activations")
    w8a8 = a is not None
    if w8a8:
        dynamic_token = (str(a.get("type", "int")).lower() == "int" and a.get("num_bits") == 8
                         and bool(a.get("symmetric", True)) and a.get("dynamic") is True
                         and str(a.get("strategy")).lower() == "token")
        if not dynamic_token or bits != 8 or strategy == "group":
            raise ModelLoadError(f"{path}: activations quantized as {_describe(a)} with {bits}-bit {strategy} "
                                 f"weights; {_SUPPORTED} (W8A8 = 8-bit channel or tensor weights, int8 "
                                 "activations with dynamic symmetric per-token scales)")
    act_order = str(w.get("actorder")).lower() in ("group", "dynamic", "true")  # "weight" / "static": no g_idx
    return CompressedTensorsScheme(fmt, bits, strategy, group_size if strategy == "group" else None,
                                   symmetric, w8a8, act_order and strategy == "group")


def _describe(args: dict[str, Any]) -> str:
    return (f"{args.get('type')} {args.get('num_bits')}-bit, strategy {args.get('strategy')}, "
            f"dynamic={args.get('dynamic')}, symmetric={args.get('symmetric')}")


def compressed_tensors_weight(name: str, scheme: CompressedTensorsScheme, parts: dict[str, torch.Tensor]):
    """One layer's tensors as a GroupedIntWeight (block kernels) or ChannelInt8Weight (W8A8)."""
    offset = 1 << (scheme.bits - 1)  # signed q stored unsigned as q + offset (pack-quantized)
    if "weight_packed" in parts:
        packed = parts["weight_packed"]
        N, K = (int(v) for v in parts["weight_shape"].reshape(-1)[:2])
        q = _unpack_rows(name, packed, scheme.bits, K)  # [N, K] unsigned
        if q.shape[0] != N:
            raise ModelLoadError(f"{name}: weight_packed has {q.shape[0]} rows, weight_shape says {N}")
    else:
        signed = parts["weight"]
        if signed.dtype != torch.int8:
            raise ModelLoadError(f"{name}: weight is {signed.dtype}; a {scheme.format} layer stores int8")
        q = signed.to(torch.int16) + offset
        N, K = signed.shape
    if int(q.min()) < 0 or int(q.max()) >= 2 * offset:
        raise ModelLoadError(f"{name}: values outside the {scheme.bits}-bit range the config declares")
    scales = parts["weight_scale"].to(torch.float32)
    if scales.dim() < 2 and scales.numel() in (1, N):  # one scale (tensor), or one a row saved 1-D
        scales = scales.reshape(1, 1).expand(N, 1) if scales.numel() == 1 else scales.reshape(N, 1)
    G = scales.shape[1] if scales.dim() == 2 else 0
    if not G or scales.shape[0] != N or K % G or (scheme.strategy == "group" and G != K // scheme.group_size):
        raise ModelLoadError(f"{name}: weight_scale {tuple(parts['weight_scale'].shape)} does not fit the weight "
                             f"[{N}, {K}] with {scheme.strategy} scales (group_size {scheme.group_size})")
    if scheme.w8a8:
        return ChannelInt8Weight(name, (q - offset).to(torch.int8), scales[:, 0])
    zeros = torch.full((N, G), offset, dtype=torch.int16)
    if not scheme.symmetric:
        zeros = _zero_points(name, parts.get("weight_zero_point"), scheme, N, G) + offset
    group = torch.arange(K) // (K // G)  # [K]
    input_perm = None
    g_idx = parts.get("weight_g_idx")
    if g_idx is not None and not torch.equal(g_idx.to(torch.int64).reshape(-1), group):
        input_perm, group = sorted_by_group(name, g_idx, K, G)
        q = q[:, input_perm]
    return GroupedIntWeight(name, scheme.bits, q, group, zeros, scales, input_perm)


def _unpack_rows(name: str, packed: torch.Tensor, bits: int, K: int) -> torch.Tensor:
    """int32 [N, ceil(K*b/32)] -> int16 [N, K]: field i of word c is column (32/b) c + i."""
    if packed.dtype != torch.int32:
        raise ModelLoadError(f"{name}: weight_packed is {packed.dtype}, not int32")
    per_word = 32 // bits
    if packed.shape[1] * per_word < K:
        raise ModelLoadError(f"{name}: weight_packed {tuple(packed.shape)} holds fewer than {K} columns")
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    fields = (packed.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # [N, words, per_word]
    return fields.reshape(packed.shape[0], -1)[:, :K].to(torch.int16)


def _zero_points(name: str, stored: torch.Tensor | None, scheme: CompressedTensorsScheme, N: int,
                 G: int) -> torch.Tensor:
    """int16 [N, G] signed zero points: pack-quantized packs them along N (int32 [N*b/32, G]), naive stores
    int8 [N, G]."""
    if stored is None:
        raise ModelLoadError(f"{name}: asymmetric weights without weight_zero_point")
    if stored.dtype == torch.int32 and scheme.format == "pack-quantized":
        zeros = _unpack_rows(name, stored.t().contiguous(), scheme.bits, N).t() - (1 << (scheme.bits - 1))
    else:
        zeros = stored.to(torch.int16).reshape(N, -1)
    if tuple(zeros.shape) != (N, G):
        raise ModelLoadError(f"{name}: weight_zero_point {tuple(stored.shape)} does not fit {N} rows, {G} groups")
    return zeros


def compressed_tensors_weights(weights: Iterator[tuple[str, Any]], scheme: CompressedTensorsScheme,
                               path: str) -> Iterator[tuple[str, Any]]:
    """The checkpoint's (name, tensor) stream with each quantized layer's tensors replaced by one
    (prefix + ".weight", GroupedIntWeight | ChannelInt8Weight); float tensors (unquantized layers, norms,
    embeddings) pass through. A layer is emitted once its tensors have all arrived (they may span shards)."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    needed = ({"weight_packed", "weight_shape"} if scheme.format == "pack-quantized" else {"weight"})
    needed = (needed | {"weight_scale"} | (set() if scheme.symmetric else {"weight_zero_point"})
              | ({"weight_g_idx"} if scheme.act_order else set()))
    for name, tensor in weights:
        prefix, _, part = name.rpartition(".")
        if part not in _PARTS and not (part == "weight" and _is_integer(tensor)):
            if part in ("input_scale", "input_zero_point"):
                raise ModelLoadError(f"{path}: {name}: static activation scales; {_SUPPORTED}")
            yield name, tensor
            continue
        if part == "weight_g_idx" and not scheme.act_order:  # saved by some versions without actorder "group"
            _check_plain_order(f"{path}: {name}", materialize(tensor), scheme)
            continue
        got = pending.setdefault(prefix, {})
        got[part] = materialize(tensor)
        if needed <= got.keys():
            yield prefix + ".weight", compressed_tensors_weight(prefix, scheme, pending.pop(prefix))
    for prefix, got in pending.items():
        missing = sorted(needed - got.keys())
        if missing:
            raise ModelLoadError(f"{path}: {prefix} has {sorted(got)} but not {missing}; the checkpoint is "
                                 f"incomplete or not {scheme.format} with the config's scheme")
        yield prefix + ".weight", compressed_tensors_weight(prefix, scheme, got)


def _check_plain_order(name: str, g_idx: torch.Tensor, scheme: CompressedTensorsScheme) -> None:
    """A weight_g_idx where the config's actorder is not "group" must be the plain order (k // group_size)."""
    K = g_idx.numel()
    size = scheme.group_size or K
    if not torch.equal(g_idx.to(torch.int64).reshape(-1), torch.arange(K) // size):
        raise ModelLoadError(f"{name}: a reordering weight_g_idx, but the config's actorder is not 'group'; "
                             "set actorder 'group' in config.json's weights scheme (or re-save the model)")


def _is_integer(tensor: Any) -> bool:
    """A stored weight of integers (naive / int-quantized), as opposed to a float layer left unquantized."""
    if isinstance(tensor, torch.Tensor):
        return not tensor.is_floating_point()
    return str(getattr(tensor, "dtype_name", "")).upper().startswith(("I", "U"))
