"""Tiny compressed-tensors checkpoints written here, from a tiny HF model's weights: each decoder linear
quantized the way llm-compressor's schemes define it and stored in the format compressed-tensors writes,
with the quantization_config it writes. Written from the format's definition, field by field, not with
the loader's code, so a mistake in either shows. Test-only.

    signed q in [-2^(b-1), 2^(b-1) - 1];  W[n, k] = scale[n, g] * (q[n, k] - zp[n, g])
    pack-quantized   weight_packed int32 [N, K b/32]: bits bi.. of [n, c] = q[n, (32/b) c + i] + 2^(b-1);
                     weight_shape int64 [2];  weight_zero_point int32 [N b/32, G] packed the same way along N
    naive / int-quantized   weight int8 [N, K] = q;  weight_zero_point int8 [N, G]
    weight_scale [N, G] (group), [N, 1] (channel), [1] (tensor) in the model's dtype;  weight_g_idx [K]
"""

from __future__ import annotations

import torch

from .gptq_awq_checkpoints import act_order_perm, quantize_linears, replace_weights

SCHEMES = {  # name -> (format, bits, strategy, group_size, symmetric, W8A8 activations, actorder)
    "w8a8": ("int-quantized", 8, "channel", None, True, True, None),
    "w8a8-tensor": ("int-quantized", 8, "tensor", None, True, True, None),
    "w4a16": ("pack-quantized", 4, "group", 64, True, False, None),
    "w4a16-asym": ("pack-quantized", 4, "group", 32, False, False, None),
    "w4a16-channel": ("pack-quantized", 4, "channel", None, True, False, None),
    "w4a16-actorder": ("pack-quantized", 4, "group", 32, True, False, "group"),
    "w4a16-naive": ("naive-quantized", 4, "group", 64, True, False, None),
    "w8a16": ("pack-quantized", 8, "group", 32, True, False, None),
}


def quantize(w: torch.Tensor, bits: int, strategy: str, group_size: int | None, symmetric: bool,
             scale_dtype=torch.bfloat16, perm: torch.Tensor | None = None):
    """w fp32 [N, K] -> (q int64 [N, K] signed, scales [N, G] of scale_dtype, zp int64 [N, G], g_idx [K] or
    None), compressed-tensors' arithmetic: symmetric scale = max|w| / ((2^b - 1) / 2), zp 0; asymmetric
    scale = (max - min) / (2^b - 1), zp = qmin - round(min / scale). perm (actorder "group"): inputs taken
    in that order, the i-th taken in group i // group_size."""
    N, K = w.shape
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    size = {"group": group_size, "channel": K, "tensor": K}[strategy]
    taken = w if perm is None else w[:, perm]
    groups = taken.reshape(N, K // size, size)  # tensor: [N, 1, K], its statistics taken over all rows
    whole = strategy == "tensor"
    amax = groups.abs().amax().expand(N, 1) if whole else groups.abs().amax(-1)
    lo = (groups.amin().expand(N, 1) if whole else groups.amin(-1)).clamp(max=0)
    hi = (groups.amax().expand(N, 1) if whole else groups.amax(-1)).clamp(min=0)
    if symmetric:
        scales = (amax / ((qmax - qmin) / 2)).clamp_min(1e-4).to(scale_dtype)
        zp = torch.zeros(scales.shape, dtype=torch.int64)
    else:
        scales = ((hi - lo) / (qmax - qmin)).clamp_min(1e-4).to(scale_dtype)
        zp = (qmin - torch.round(lo / scales.float())).clamp(qmin, qmax).to(torch.int64)
    q = torch.round(groups / scales.float()[..., None]) + zp[..., None]
    q = q.clamp(qmin, qmax).to(torch.int64).reshape(N, K)
    g_idx = None
    if perm is not None:
        q_taken, q = q, torch.empty_like(q)
        q[:, perm] = q_taken
        g_idx = torch.empty(K, dtype=torch.int64)
        g_idx[perm] = torch.arange(K) // size
    return q, scales, zp, g_idx


def dequantized(q, scales, zp, g_idx=None) -> torch.Tensor:
    """fp64 [N, K]: scale * (q - zp), the format's definition."""
    K, G = q.shape[1], scales.shape[1]
    group = torch.arange(K) // (K // G) if g_idx is None else g_idx
    return scales.double()[:, group] * (q.double() - zp.double()[:, group])


def _pack_rows(values: torch.Tensor, bits: int) -> torch.Tensor:
    """int64 [rows, cols] of unsigned b-bit fields -> int32 [rows, cols b / 32]: field i of word c =
    values[:, (32/b) c + i]."""
    per_word = 32 // bits
    packed = torch.zeros(values.shape[0], values.shape[1] // per_word, dtype=torch.int64)
    for i in range(per_word):
        packed |= values[:, i::per_word] << (bits * i)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)  # the int32 bit pattern


def layer_tensors(q, scales, zp, g_idx, fmt: str, bits: int, symmetric: bool,
                  strategy: str) -> dict[str, torch.Tensor]:
    """One layer's stored tensors (local names: weight_packed, weight_scale, ...)."""
    offset = 1 << (bits - 1)
    stored = {"weight_scale": scales[:1, :1].reshape(1) if strategy == "tensor" else scales.contiguous()}
    if fmt == "pack-quantized":
        stored["weight_packed"] = _pack_rows(q + offset, bits)
        stored["weight_shape"] = torch.tensor(list(q.shape), dtype=torch.int64)
        if not symmetric:
            stored["weight_zero_point"] = _pack_rows((zp + offset).t().contiguous(), bits).t().contiguous()
    else:
        stored["weight"] = q.to(torch.int8)
        if not symmetric:
            stored["weight_zero_point"] = zp.to(torch.int8)
    if g_idx is not None:
        stored["weight_g_idx"] = g_idx.to(torch.int32)
    return stored


def quantization_config(scheme: str) -> dict:
    fmt, bits, strategy, group_size, symmetric, w8a8, actorder = SCHEMES[scheme]
    activations = ({"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True,
                    "group_size": None, "actorder": None, "block_structure": None, "observer": None}
                   if w8a8 else None)
    weights = {"num_bits": bits, "type": "int", "symmetric": symmetric, "strategy": strategy,
               "group_size": group_size, "dynamic": False, "actorder": actorder, "block_structure": None,
               "observer": "minmax"}
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": activations, "output_activations": None}},
            "ignore": ["lm_head"], "kv_cache_scheme": None, "global_compression_ratio": None}


def write_compressed_tensors_folder(folder, scheme: str, kind: str = "llama", float_dtype: torch.dtype | None = None):
    """An HF folder of `kind` (tiny_models) whose decoder linears are stored in `scheme` (SCHEMES); float_dtype:
    the unquantized token embedding and lm_head stored in that dtype (their values rounded to it). Returns
    (folder, dense reference model): the HF model whose linears hold the dequantised weights (and the rounded
    embedding and head)."""
    fmt, bits, strategy, group_size, symmetric, _, actorder = SCHEMES[scheme]

    def quantize_linear(prefix: str, w: torch.Tensor):
        perm = act_order_perm(prefix, w.shape[1]) if actorder == "group" else None
        q, scales, zp, g_idx = quantize(w, bits, strategy, group_size, symmetric, perm=perm)
        return (layer_tensors(q, scales, zp, g_idx, fmt, bits, symmetric, strategy),
                dequantized(q, scales, zp, g_idx).float())

    model, tensors = quantize_linears(folder, kind, quantize_linear, float_dtype)
    replace_weights(folder, tensors, quantization_config(scheme))
    return str(folder), model
