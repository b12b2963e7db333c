"""ModelConfig validates at construction and names the value to change."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pagedcore.model_config import ModelConfig, dtype_name

BASE = ModelConfig(architecture="LlamaForCausalLM", hidden_size=64, intermediate_size=128, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=100, rms_norm_eps=1e-5,
                   rope_theta=10000.0, max_position_embeddings=128, tie_word_embeddings=False)


def test_valid_config_and_derived_sizes():
    assert (BASE.q_size, BASE.kv_size, BASE.torch_dtype) == (64, 32, torch.float32)
    assert dataclasses.replace(BASE, dtype=torch.bfloat16).dtype == "bfloat16"
    assert dataclasses.replace(BASE, eos_token_ids=[2, 3]).eos_token_ids == (2, 3)
    assert dataclasses.replace(BASE, rope_scaling={"rope_type": "default"}).rope_scaling is None
    linear = dataclasses.replace(BASE, rope_scaling={"type": "linear", "factor": 2.0}).rope_scaling
    assert linear["rope_type"] == "linear"


@pytest.mark.parametrize("change, message", [
    ({"num_layers": 0}, "num_layers must be a positive int"),
    ({"hidden_size": 64.0}, "hidden_size must be a positive int"),
    ({"num_kv_heads": 3}, r"num_heads \(4\) must be a multiple of num_kv_heads \(3\)"),
    ({"head_dim": 15}, "head_dim .* must be even"),
    ({"rms_norm_eps": 0.0}, "rms_norm_eps must be > 0"),
    ({"dtype": "float16"}, r"float16 \(fp16 activations\) is not supported"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "rope_scaling type 'yarn' is not supported"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "lacks .*low_freq_factor"),
    ({"rope_scaling": {"rope_type": "linear"}}, "needs a positive 'factor'"),
])
def test_invalid_values_are_named(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(BASE, **change)


def test_dtype_spellings():
    assert dtype_name("bf16") == dtype_name(torch.bfloat16) == "bfloat16"
    assert dtype_name("fp32") == dtype_name("float32") == "float32"
