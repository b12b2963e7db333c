"""Tiny FP8 checkpoints written here, from a tiny HF model's weights: each decoder linear quantized to OCP fp8
e4m3 the way the writers define it and stored with the quantization_config they write. Written from the formats'
definitions, not with the loader's code, so a mistake in either shows. Test-only.

    W[n, k] = scale[n] * fp8(weight[n, k]),  scale = max |W| / 448 over the row (channel) or tensor
    compressed-tensors "float-quantized" (llm-compressor FP8_DYNAMIC / FP8): weight float8_e4m3fn [N, K],
        weight_scale [N, 1] (channel) or [1] (tensor) in the model's dtype; input_scale [1] when static
    quant_method "fp8" (vLLM / AutoFP8): weight float8_e4m3fn [N, K], weight_scale fp32 [] (per tensor),
        input_scale fp32 [] when activation_scheme is "static"
    block-wise (DeepSeek-V3 / Qwen3 FP8: quant_method "fp8" with weight_block_size [bn, bk], weight_scale_inv fp32
        [ceil(N / bn), ceil(K / bk)]; llm-compressor FP8_BLOCK: strategy "block", block_structure, weight_scale):
        W[n, k] = scale[n // bn][k // bk] * fp8(weight[n, k]), scale = max |W| / 448 over the block
"""

from __future__ import annotations

import torch

from .gptq_awq_checkpoints import quantize_linears, replace_weights

FP8_MAX = 448.0
# name -> (quant_method, weight strategy, static input scales)
SCHEMES = {
    "ct-fp8-dynamic": ("compressed-tensors", "channel", False),
    "ct-fp8-static": ("compressed-tensors", "tensor", True),
    "fp8-static": ("fp8", "tensor", True),
    "fp8-dynamic": ("fp8", "tensor", False),
    "fp8-block": ("fp8", "block", False),  # DeepSeek / Qwen3 FP8: 128 x 128 blocks (the tiny k_proj: one partial)
    "ct-fp8-block": ("compressed-tensors", "block", False),  # FP8_BLOCK, with smaller blocks: several per layer
}
BLOCK_SIZES = {"fp8-block": (128, 128), "ct-fp8-block": (32, 64)}


def quantize(w: torch.Tensor, strategy: str, scale_dtype: torch.dtype,
             block: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """w fp32 [N, K] -> (float8_e4m3fn [N, K], scales [N, 1], [] or (block) [ceil(N / bn), ceil(K / bk)] of
    scale_dtype)."""
    if strategy == "block":
        scales = (_block_amax(w, *block) / FP8_MAX).clamp_min(1e-8).to(scale_dtype)
        q = (w / _per_weight(scales.float(), w.shape, block)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return q, scales
    amax = w.abs().amax(dim=1, keepdim=True) if strategy == "channel" else w.abs().amax()
    scales = (amax / FP8_MAX).clamp_min(1e-8).to(scale_dtype)
    q = (w / scales.float()).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scales


def _block_amax(w: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    """max |w| over each bn x bk block (the last ones partial): [ceil(N / bn), ceil(K / bk)]."""
    N, K = w.shape
    return torch.stack([torch.stack([w[i:i + bn, j:j + bk].abs().amax() for j in range(0, K, bk)])
                        for i in range(0, N, bn)])


def _per_weight(scales: torch.Tensor, shape, block) -> torch.Tensor:
    """A block table spread to one scale per weight [N, K]."""
    bn, bk = block
    return scales.repeat_interleave(bn, 0).repeat_interleave(bk, 1)[:shape[0], :shape[1]]


def dequantized(q: torch.Tensor, scales: torch.Tensor, block: tuple[int, int] | None = None) -> torch.Tensor:
    """fp64 [N, K]: scale * fp8 value, the formats' definition."""
    if block is not None:
        return q.to(torch.float64) * _per_weight(scales.to(torch.float64), q.shape, block)
    return q.to(torch.float64) * scales.to(torch.float64).reshape(-1, 1)


def quantization_config(scheme: str) -> dict:
    method, strategy, static = SCHEMES[scheme]
    block = list(BLOCK_SIZES[scheme]) if strategy == "block" else None
    if method == "fp8":
        config = {"quant_method": "fp8", "activation_scheme": "static" if static else "dynamic",
                  "ignored_layers": ["lm_head"]}
        return {**config, "fmt": "e4m3", "weight_block_size": block} if block else config
    activations = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": not static,
                   "strategy": "tensor" if static else "token", "group_size": None, "block_structure": None}
    if block:  # FP8_BLOCK: activations per token group of 128 (dynamic)
        activations.update(strategy="group", group_size=128)
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy, "dynamic": False,
               "group_size": None, "block_structure": block, "actorder": None, "observer": "minmax"}
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": activations, "output_activations": None}},
            "ignore": ["lm_head"], "kv_cache_scheme": None}


def layer_tensors(q: torch.Tensor, scales: torch.Tensor, scheme: str) -> dict[str, torch.Tensor]:
    """One layer's stored tensors (local names)."""
    method, strategy, static = SCHEMES[scheme]
    if strategy == "block":
        # vLLM / DeepSeek name the table weight_scale_inv (multiplied in all the same); compressed-tensors weight_scale
        return {"weight": q.contiguous(), ("weight_scale_inv" if method == "fp8" else "weight_scale"): scales}
    if method == "fp8":
        weight_scale = scales.reshape(())  # AutoFP8 / vLLM: a 0-d fp32 scale
    else:
        weight_scale = scales.reshape(-1, 1) if strategy == "channel" else scales.reshape(1)
    stored = {"weight": q.contiguous(), "weight_scale": weight_scale.contiguous()}
    if static:
        stored["input_scale"] = torch.tensor(0.02) if method == "fp8" else torch.tensor([0.02], dtype=scales.dtype)
    return stored


def write_fp8_folder(folder, scheme: str, kind: str = "llama"):
    """An HF folder of `kind` (tiny_models) whose decoder linears are stored fp8 in `scheme`. Returns (folder,
    dense reference model): the HF model whose linears hold the dequantised weights, rounded to fp32."""
    method = SCHEMES[scheme][0]
    scale_dtype = torch.float32 if method == "fp8" else torch.bfloat16

    block = BLOCK_SIZES.get(scheme)

    def quantize_linear(prefix: str, w: torch.Tensor):
        q, scales = quantize(w, SCHEMES[scheme][1], scale_dtype, block)
        return layer_tensors(q, scales, scheme), dequantized(q, scales, block).float()

    model, tensors = quantize_linears(folder, kind, quantize_linear)
    replace_weights(folder, tensors, quantization_config(scheme))
    return str(folder), model
