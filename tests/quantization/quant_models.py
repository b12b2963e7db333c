"""Tiny GGUF files whose linear layers are quantized in every format the kernels read, including
layers that mix formats (as llama.cpp's Q4_K_M files do). Test-only."""

from __future__ import annotations

from gguf import GGMLQuantizationType as T

from ..loader import tiny_gguf
from ..models import tiny_models
from .blocks import random_blocks


def kquant_hf_model(seed: int = 0):
    """A tiny Llama with rows of 256 and 512 weights (k-quant blocks are 256 wide)."""
    import torch
    import transformers

    config = transformers.LlamaConfig(vocab_size=tiny_models.VOCAB_SIZE, hidden_size=256, intermediate_size=512,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=256, rms_norm_eps=1e-5, initializer_range=0.05,
                                      bos_token_id=1, eos_token_id=2, rope_theta=10000.0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


# GGUF tensor -> type of the k-quant model (rows [out, in] of hidden 256 / intermediate 512):
# layer 0 as Q4_K_M writes it (q, k Q4_K; v Q6_K: a qkv of two formats; down Q6_K), its o_proj
# left F32 (a float part inside a quantized model); layer 1's gate Q5_K next to an up in Q4_K
# (a gate_up of two formats: no fused SwiGLU); the table Q4_K, the LM head Q6_K.
KQUANT_TYPES = {
    "token_embd.weight": T.Q4_K, "output.weight": T.Q6_K,
    "blk.0.attn_q.weight": T.Q4_K, "blk.0.attn_k.weight": T.Q4_K, "blk.0.attn_v.weight": T.Q6_K,
    "blk.0.ffn_gate.weight": T.Q4_K, "blk.0.ffn_up.weight": T.Q4_K, "blk.0.ffn_down.weight": T.Q6_K,
    "blk.1.attn_q.weight": T.Q5_K, "blk.1.attn_k.weight": T.Q5_K, "blk.1.attn_v.weight": T.Q5_K,
    "blk.1.attn_output.weight": T.Q4_K,
    "blk.1.ffn_gate.weight": T.Q5_K, "blk.1.ffn_up.weight": T.Q4_K, "blk.1.ffn_down.weight": T.Q4_K,
}


# Types the loader converts exactly into a kernel format (loader/gguf_held_as.py: Q3_K -> Q6_K, IQ4_NL -> Q8_0), as
# llama.cpp's Q2_K / IQ4 files of a small model hold them: Q3_K ffn_down, IQ4_NL fallbacks; layer 0's qkv of IQ4_NL
# q / k beside a Q3_K v (a layer of two converted formats), an IQ4_NL table under a Q3_K head; the rest Q4_K.
CONVERTED_TYPES = {
    "token_embd.weight": T.IQ4_NL, "output.weight": T.Q3_K,
    **{f"blk.{i}.{name}.weight": T.Q4_K for i in (0, 1) for name in ("attn_output", "ffn_gate", "ffn_up")},
    "blk.0.attn_q.weight": T.IQ4_NL, "blk.0.attn_k.weight": T.IQ4_NL, "blk.0.attn_v.weight": T.Q3_K,
    **{f"blk.1.{name}.weight": T.Q3_K for name in ("attn_q", "attn_k", "attn_v")},
    "blk.0.ffn_down.weight": T.Q3_K, "blk.1.ffn_down.weight": T.IQ4_NL,
}


# The same model with one format per linear layer (what the C++ decoder stack runs): layer 0 in
# Q4_K with a Q6_K down, layer 1 in Q5_K with a Q6_K gate_up; the table Q4_K, the LM head Q6_K.
KQUANT_UNIFORM_TYPES = {
    "token_embd.weight": T.Q4_K, "output.weight": T.Q6_K,
    **{f"blk.0.{name}.weight": T.Q4_K for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
                                                    "ffn_up")},
    "blk.0.ffn_down.weight": T.Q6_K,
    **{f"blk.1.{name}.weight": T.Q5_K for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_down")},
    "blk.1.ffn_gate.weight": T.Q6_K, "blk.1.ffn_up.weight": T.Q6_K,
}


def write_kquant_gguf(path, types: dict | None = None) -> str:
    """The k-quant model with KQUANT_TYPES (or `types`: GGUF tensor -> type; the rest F32)."""
    hf_model = kquant_hf_model()
    shapes = {tiny_gguf.gguf_name(name): tuple(p.shape) for name, p in hf_model.state_dict().items()}
    raw = {name: (random_blocks(qtype, shapes[name][0], shapes[name][1], seed=index), qtype)
           for index, (name, qtype) in enumerate((types or KQUANT_TYPES).items())}
    return tiny_gguf.write_gguf(hf_model, path, T.F32, "llama", tokenizer=tiny_models.make_tokenizer(),
                                raw_tensors=raw)


def write_block_gguf(path, kind: str, matrix_type: T, tensor_types: dict | None = None) -> str:
    """A tiny HF model of `kind` with its matrices quantized by gguf.quants (32-weight formats)."""
    arch = "qwen2" if kind == "qwen2" else "llama"
    return tiny_gguf.write_gguf(tiny_models.build_hf_model(kind), path, matrix_type, arch,
                                tensor_types=tensor_types, tokenizer=tiny_models.make_tokenizer())
