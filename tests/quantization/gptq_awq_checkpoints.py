"""Tiny GPTQ and AWQ checkpoints written here, from a tiny HF model's weights: each linear layer of the
decoder quantized to 4 (GPTQ: or 8) bits per group of inputs and packed the way AutoGPTQ / AutoAWQ save it,
with the quantization_config they write. The packing below is written independently of the loader's
unpacking (field by field, from the formats' definitions), so a mistake in either shows. Test-only.

    GPTQ  b bits, p = 32 / b a word: qweight int32 [K/p, N]: bits bj.. of [i, n] = q[p i + j, n];
          qzeros int32 [G, N/p]: bits bj.. of [g, c] = zero[g, p c + j] - 1 (checkpoint_format "gptq";
          "gptq_v2": the zero);  scales fp16 [G, N];  g_idx int32 [K]
    AWQ   qweight int32 [K, N/8]: bits 4i.. of [k, c] = q[k, 8c + ORDER[i]];  qzeros likewise;  scales fp16
"""

from __future__ import annotations

import json
import os

import torch

from ..models import tiny_models

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's: nibble i holds column ORDER[i] of its 8


def quantize_groups(w: torch.Tensor, group_size: int, sym: bool, bits: int = 4):
    """w fp32 [N, K] -> (q int64 [N, K] in 0..2^b-1, zeros int64 [N, G], scales fp16 [N, G]) with groups of
    group_size inputs: sym, zero 2^(b-1) and scale max|w| / (2^(b-1) - 1); else min..max over 0..2^b-1 with an
    integer zero in 1..2^b-1 (GPTQ's zero - 1 storage cannot hold 0)."""
    N, K = w.shape
    top = (1 << bits) - 1
    groups = w.reshape(N, K // group_size, group_size)
    if sym:
        scales = (groups.abs().amax(-1) / (top // 2)).clamp_min(1e-4).half()
        zeros = torch.full(scales.shape, 1 << (bits - 1), dtype=torch.int64)
    else:
        lo, hi = groups.amin(-1).clamp(max=0), groups.amax(-1).clamp(min=0)
        scales = ((hi - lo) / top).clamp_min(1e-4).half()
        zeros = torch.round(-lo / scales.float()).clamp(1, top).to(torch.int64)
    q = torch.round(groups / scales.float()[..., None] + zeros[..., None]).clamp(0, top).to(torch.int64)
    return q.reshape(N, K), zeros, scales


def quantize_act_order(w: torch.Tensor, group_size: int, sym: bool, perm: torch.Tensor, bits: int = 4):
    """GPTQ with desc_act=True: inputs are quantized in the order perm (perm[i] is the i-th input taken), the
    i-th taken falling in group i // group_size. Returns (q [N, K] in input order, zeros, scales, g_idx [K])."""
    q_taken, zeros, scales = quantize_groups(w[:, perm], group_size, sym, bits)
    q = torch.empty_like(q_taken)
    q[:, perm] = q_taken
    g_idx = torch.empty(w.shape[1], dtype=torch.int64)
    g_idx[perm] = torch.arange(w.shape[1]) // group_size
    return q, zeros, scales, g_idx


def dequantized(q, zeros, scales, group_size, g_idx=None) -> torch.Tensor:
    """fp64 [N, K]: scale * (q - zero), the formats' definition (input k in group g_idx[k])."""
    group = torch.arange(q.shape[1]) // group_size if g_idx is None else g_idx
    return scales.double()[:, group] * (q.double() - zeros.double()[:, group])


def _pack(values: torch.Tensor, order=None, bits: int = 4) -> torch.Tensor:
    """int64 [rows, p c] of b-bit fields (p = 32 / b) -> int32 [rows, c]: field i of each int32 =
    values[:, p c + order[i]]."""
    rows, cols = values.shape
    per_word = 32 // bits
    packed = torch.zeros(rows, cols // per_word, dtype=torch.int64)
    for i, column in enumerate(order or range(per_word)):
        packed |= values[:, column::per_word] << (bits * i)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)  # the int32 bit pattern


def pack_gptq(q, zeros, scales, group_size: int, zero_minus_one: bool = True, g_idx=None,
              bits: int = 4) -> dict[str, torch.Tensor]:
    """q [N, K], zeros [N, G], scales [N, G] -> AutoGPTQ's tensors (qweight: 32 / b consecutive inputs of one
    output in each int32, [K b / 32, N])."""
    stored_zeros = (zeros - 1) & ((1 << bits) - 1) if zero_minus_one else zeros  # AutoGPTQ: zero - 1, in b bits
    if g_idx is None:
        g_idx = torch.arange(q.shape[1]) // group_size
    return {"qweight": _pack(q.contiguous(), bits=bits).t().contiguous(),
            "qzeros": _pack(stored_zeros.t().contiguous(), bits=bits),
            "scales": scales.t().contiguous(), "g_idx": g_idx.to(torch.int32)}


def pack_awq(q, zeros, scales) -> dict[str, torch.Tensor]:
    return {"qweight": _pack(q.t().contiguous(), AWQ_ORDER), "qzeros": _pack(zeros.t().contiguous(), AWQ_ORDER),
            "scales": scales.t().contiguous()}


def write_gptq_awq_folder(folder, method: str, kind: str = "llama", group_size: int = 64, sym: bool = True,
                      checkpoint_format: str = "gptq", act_order: bool = False, bits: int = 4,
                      float_dtype: torch.dtype | None = None):
    """An HF folder of `kind` (tiny_models) whose decoder linears are `method` ("gptq" | "awq") weights of
    `bits` bits (AWQ: 4). float_dtype: the unquantized token embedding and lm_head stored in that dtype (fp16,
    as GPTQ / AWQ checkpoints have them; the reference holds the rounded values).
    act_order (GPTQ): each layer's inputs taken in a random order, one order for the linears that share an
    input (q/k/v, gate/up), as GPTQ's Hessian order is. Returns (folder, dense reference model): the HF model
    whose linears hold the dequantised weights."""
    def quantize_linear(prefix: str, w: torch.Tensor):
        g_idx = None
        if act_order:
            q, zeros, scales, g_idx = quantize_act_order(w, group_size, sym, act_order_perm(prefix, w.shape[1]), bits)
        else:
            q, zeros, scales = quantize_groups(w, group_size, sym and method == "gptq", bits)
        packed = (pack_gptq(q, zeros, scales, group_size, checkpoint_format == "gptq", g_idx, bits)
                  if method == "gptq" else pack_awq(q, zeros, scales))
        return packed, dequantized(q, zeros, scales, group_size, g_idx).float()

    model, tensors = quantize_linears(folder, kind, quantize_linear, float_dtype)
    replace_weights(folder, tensors, (
        {"quant_method": "gptq", "bits": bits, "group_size": group_size, "desc_act": act_order, "sym": sym,
         "checkpoint_format": checkpoint_format} if method == "gptq" else
        {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemm"}))
    return str(folder), model


def quantize_linears(folder, kind: str, quantize_linear, float_dtype: torch.dtype | None = None):
    """The tiny HF model of `kind` saved to `folder`, then each decoder linear's weight handed to
    quantize_linear(prefix, w fp32 [N, K]) -> (its stored tensors by local name, the dequantised fp32 [N, K]
    the reference model takes). float_dtype: the token embedding and lm_head stored in that dtype (the
    reference holds the rounded values). Returns (the reference model, every tensor to store by name)."""
    model = tiny_models.build_hf_model(kind)
    tiny_models.save_hf_folder(model, folder)
    tensors = {}
    with torch.no_grad():
        for name, param in model.state_dict().items():
            prefix, _, leaf = name.rpartition(".")
            if leaf != "weight" or prefix.rpartition(".")[2] not in LINEARS:
                stored = param.dtype
                if name in ("lm_head.weight", "model.embed_tokens.weight") and float_dtype is not None:
                    param.copy_(param.to(float_dtype).float())  # the reference holds the rounded values
                    stored = float_dtype
                tensors[name] = param.to(stored, copy=True)  # (a copy: a tied model's head and table share memory)
                continue
            stored_parts, dense = quantize_linear(prefix, param.float())
            tensors.update({f"{prefix}.{part}": value for part, value in stored_parts.items()})
            param.copy_(dense)  # the reference's dense weight
    return model, tensors


def act_order_perm(prefix: str, K: int) -> torch.Tensor:
    """A layer's random act order, one for the linears that share an input (q/k/v, gate/up), as GPTQ's
    Hessian order is: int64 [K], seeded by the layer's name."""
    module, _, linear = prefix.rpartition(".")
    shared = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}
    seed = sum(map(ord, module + shared.get(linear, linear)))
    return torch.randperm(K, generator=torch.Generator().manual_seed(seed))


def replace_weights(folder, tensors: dict[str, torch.Tensor], quantization_config: dict) -> None:
    """The HF folder's safetensors replaced by `tensors` (one file) and its config.json given the
    quantization_config."""
    from safetensors.torch import save_file

    for name in os.listdir(folder):
        if name.endswith(".safetensors") or name == "model.safetensors.index.json":
            os.remove(os.path.join(folder, name))
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    config_path = os.path.join(folder, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["quantization_config"] = quantization_config
    with open(config_path, "w") as f:
        json.dump(config, f)
