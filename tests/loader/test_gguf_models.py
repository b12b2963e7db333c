"""Tiny models written as GGUF files (each tensor type, Llama's permuted Q/K rows, Qwen2 biases,
Qwen3 q/k norms, Llama 3.1 rope_freqs), loaded by pagedcore and compared with HF transformers."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as T

from pagedcore.loader import load_model

from . import tiny_gguf
from ..models import tiny_models
from ..models.paged_driver import PagedDriver

ATOL = 1e-4
PROMPT = list(range(5, 30))


def prompt_logits(loaded) -> torch.Tensor:
    return PagedDriver(loaded.model).step([(0, PROMPT)])  # fp32 [len(PROMPT), vocab]


def hf_from_gguf(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                dtype=torch.float32).eval()


@pytest.mark.parametrize("kind, arch, matrix_type", [
    ("llama", "llama", T.Q4_1),
    ("llama", "llama", T.Q4_0),
    ("llama", "llama", T.Q5_0),
    ("llama_tied", "llama", T.Q5_1),
    ("llama_tied", "llama", T.Q8_0),
    ("llama_tied", "llama", T.F16),
    ("qwen2", "qwen2", T.Q4_0),
])
def test_quantised_gguf_matches_hf_reading_the_same_file(tmp_path, kind, arch, matrix_type):
    """Same file, two readers: equal logits mean our dequantisation, names and un-permutation agree."""
    hf_model = tiny_models.build_hf_model(kind)
    path = tmp_path / f"{kind}.gguf"
    tiny_gguf.write_gguf(hf_model, path, matrix_type, arch, tokenizer=tiny_models.make_tokenizer())
    loaded = load_model(str(path), dtype="float32")
    assert loaded.source.format == "gguf"
    assert loaded.config.tie_word_embeddings == (kind == "llama_tied")
    assert loaded.config.attention_bias == (arch == "qwen2")
    torch.testing.assert_close(prompt_logits(loaded), tiny_models.hf_logits(hf_from_gguf(path), PROMPT),
                               atol=ATOL, rtol=0)


def test_mixed_tensor_types_in_one_file(tmp_path):
    hf_model = tiny_models.build_hf_model("llama")
    path = tmp_path / "mixed.gguf"
    tiny_gguf.write_gguf(hf_model, path, T.Q4_1, "llama", tokenizer=tiny_models.make_tokenizer(),
                         tensor_types={"token_embd.weight": T.Q8_0, "output.weight": T.F16,
                                       "blk.0.attn_q.weight": T.BF16, "blk.1.attn_k.weight": T.Q4_0,
                                       "blk.2.ffn_down.weight": T.F32})
    torch.testing.assert_close(prompt_logits(load_model(str(path), dtype="float32")),
                               tiny_models.hf_logits(hf_from_gguf(path), PROMPT), atol=ATOL, rtol=0)


def test_unquantised_qwen3_gguf_equals_the_original_model(tmp_path):
    """head_dim 32 != hidden / heads: HF's GGUF reader ignores key_length, so compare with the model
    the file was written from (F32: the same weights)."""
    hf_model = tiny_models.build_hf_model("qwen3")
    path = tiny_gguf.write_gguf(hf_model, tmp_path / "qwen3.gguf", T.F32, "qwen3",
                                tokenizer=tiny_models.make_tokenizer())
    loaded = load_model(path, dtype="float32")
    assert (loaded.config.head_dim, loaded.config.qk_norm) == (32, True)
    torch.testing.assert_close(prompt_logits(loaded), tiny_models.hf_logits(hf_model, PROMPT),
                               atol=ATOL, rtol=0)


def test_llama3_rope_freqs_tensor_reproduces_llama3_scaling(tmp_path):
    """Llama 3.1 GGUFs carry RoPE scaling as a rope_freqs tensor, not as metadata."""
    hf_model = tiny_models.build_hf_model("llama")
    rope = hf_model.config.rope_parameters
    head_dim = hf_model.config.hidden_size // hf_model.config.num_attention_heads
    factors = tiny_gguf.llama3_rope_factors(head_dim, rope["rope_theta"], rope)
    assert factors.min() == 1.0 and factors.max() == rope["factor"]  # all three bands present
    path = tiny_gguf.write_gguf(hf_model, tmp_path / "llama3.gguf", T.F32, "llama", rope_freqs=factors,
                                tokenizer=tiny_models.make_tokenizer())
    loaded = load_model(path, dtype="float32")
    assert loaded.config.rope_scaling is None  # the factors come with the weights
    torch.testing.assert_close(prompt_logits(loaded), tiny_models.hf_logits(hf_model, PROMPT),
                               atol=ATOL, rtol=0)


def test_gguf_in_bfloat16(tmp_path):
    """Against the fp32 load of the same file (checked against HF above): quantisation noise in a
    tiny random model grows along the sequence, so the original model is no reference here."""
    hf_model = tiny_models.build_hf_model("llama")
    path = tiny_gguf.write_gguf(hf_model, tmp_path / "m.gguf", T.Q8_0, "llama",
                                tokenizer=tiny_models.make_tokenizer())
    loaded = load_model(path, dtype=torch.bfloat16)
    assert loaded.config.dtype == "bfloat16"
    assert all(p.dtype == torch.bfloat16 for p in loaded.model.parameters())
    reference = prompt_logits(load_model(path, dtype="float32"))
    assert (prompt_logits(loaded) - reference).abs().max() < 0.1 * reference.abs().max()
