"""Writes a tiny HF model as a GGUF file the way llama.cpp's converter does (tensor names, Q/K row
permutation for "llama", F32 norms, quantised matrices, tokenizer metadata). Test-only."""

from __future__ import annotations

import math

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

_LAYER_PARTS = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}


def gguf_name(hf_name: str) -> str:
    if hf_name in _GLOBAL:
        return _GLOBAL[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_LAYER_PARTS[module]}.{kind}"


def llama_cpp_permute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute: HF halves -> interleaved RoPE pairs."""
    return (weights.reshape(num_heads, 2, weights.shape[0] // num_heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def llama3_rope_factors(head_dim: int, theta: float, scaling: dict) -> np.ndarray:
    """llama.cpp's rope_freqs tensor for Llama 3.1 scaling: one divisor per frequency."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    factors = []
    for freq in 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)):
        wavelen = 2 * math.pi / freq
        if wavelen < old_context / high:
            factors.append(1.0)
        elif wavelen > old_context / low:
            factors.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def byte_level_vocab(tokenizer, vocab_size: int) -> tuple[list[str], list[str]]:
    """(tokens by id, merges) of a byte-level BPE tokenizer, padded to the model's vocab size."""
    import json

    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    tokens = [None] * len(model["vocab"])
    for token, index in model["vocab"].items():
        tokens[index] = token
    tokens += [f"<pad_{i}>" for i in range(len(tokens), vocab_size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


SPM_PIECES = ["\u2581", "\u2581t", "he", "\u2581the", "\u2581c", "ap", "it", "al", "\u2581cap", "ital",
              "\u2581capital", "\u2581o", "f", "\u2581of", "\u2581P", "ar", "is", "\u2581Par", "\u2581Paris",
              "\u2581F", "ra", "nce", "\u2581France", "\u2581is", "."]


def add_sentencepiece_vocab(writer, vocab_size: int) -> None:
    """A Llama-2-style sentencepiece vocabulary (tokenizer model "llama"): <unk> <s> </s>, 256 byte
    fallback tokens, then a few pieces scored by length, padded to the model's vocab size."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{byte:02X}>" for byte in range(256)] + SPM_PIECES
    types = [2, 3, 3] + [6] * 256 + [1] * len(SPM_PIECES)  # unknown, control, byte, normal
    scores = [0.0] * (3 + 256) + [-float(i) for i in range(len(SPM_PIECES))]
    padding = vocab_size - len(tokens)
    tokens += [f"<pad_{i}>" for i in range(padding)]
    types += [4] * padding  # user-defined
    scores += [-1000.0] * padding
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)


def write_gguf(hf_model, path, matrix_type: T = T.F32, arch: str = "llama",
               tensor_types: dict[str, T] | None = None, rope_freqs: np.ndarray | None = None,
               tokenizer=None, sentencepiece: bool = False,
               raw_tensors: dict[str, tuple[np.ndarray, T]] | None = None) -> str:
    """hf_model (a tiny transformers model) -> a GGUF file at path. Matrices in matrix_type unless
    tensor_types names another for a GGUF tensor; 1-D tensors stay F32 as llama.cpp keeps them.
    raw_tensors: GGUF name -> (uint8 [rows, row_bytes] blocks, type) written instead of the model's
    values (formats gguf.quants cannot quantize: the k-quants), already in file row order.
    The vocabulary: byte-level BPE from `tokenizer`, or a small sentencepiece one."""
    config = hf_model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_vocab_size(config.vocab_size)
    if sentencepiece:
        add_sentencepiece_vocab(writer, config.vocab_size)
    elif tokenizer is not None:
        tokens, merges = byte_level_vocab(tokenizer, config.vocab_size)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_types([3 if t in ("<unk>", "<s>", "</s>") else 1 for t in tokens])
        writer.add_token_merges(merges)
        writer.add_bos_token_id(tokens.index("<s>"))
        writer.add_eos_token_id(tokens.index("</s>"))
        writer.add_add_bos_token(False)
        writer.add_chat_template(tokenizer.chat_template)
    state = {name: tensor.detach().float().numpy() for name, tensor in hf_model.state_dict().items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs)
    for name, array in state.items():
        if arch == "llama" and name.endswith("q_proj.weight"):
            array = llama_cpp_permute(array, config.num_attention_heads)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            array = llama_cpp_permute(array, config.num_key_value_heads)
        target = gguf_name(name)
        if target in (raw_tensors or {}):
            blocks, qtype = raw_tensors[target]
            writer.add_tensor(target, np.ascontiguousarray(blocks), raw_dtype=qtype)
            continue
        qtype = (tensor_types or {}).get(target, matrix_type) if array.ndim == 2 else T.F32
        if qtype == T.F32:
            writer.add_tensor(target, np.ascontiguousarray(array))
        elif qtype == T.F16:
            writer.add_tensor(target, array.astype(np.float16))
        else:
            writer.add_tensor(target, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)
