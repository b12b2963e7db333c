"""Fixtures for engine tests: a tiny random Llama saved as an HF folder, and HF's greedy answers."""

from __future__ import annotations

import pytest
import torch

from tests.models import tiny_models


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """(hf_model, folder) of a tiny random Llama (GQA, llama3 RoPE scaling), fp32."""
    hf_model = tiny_models.build_hf_model("llama")
    folder = tiny_models.save_hf_folder(hf_model, tmp_path_factory.mktemp("engine_tiny_llama"))
    return hf_model, folder


def hf_greedy(hf_model, prompt: list[int], max_tokens: int) -> list[int]:
    """HF transformers' greedy continuation (no EOS stop): the reference every engine setting must equal."""
    # A plain argmax loop: generate()'s logits processors (min_new_tokens masks EOS) would bias it.
    tokens: list[int] = []
    with torch.no_grad():
        out = hf_model(torch.tensor([prompt]), use_cache=True)
        for _ in range(max_tokens):
            next_token = int(out.logits[0, -1].argmax())
            tokens.append(next_token)
            out = hf_model(torch.tensor([[next_token]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens


def prompts_with_shared_prefix(num: int, seed: int = 0) -> list[list[int]]:
    """Prompts of 5..90 tokens; half start with the same 40-token 'system prompt' (prefix-cache hits)."""
    g = torch.Generator().manual_seed(seed)
    system = torch.randint(3, tiny_models.VOCAB_SIZE, (40,), generator=g).tolist()
    prompts = []
    for i in range(num):
        n = int(torch.randint(5, 50, (1,), generator=g))
        tail = torch.randint(3, tiny_models.VOCAB_SIZE, (n,), generator=g).tolist()
        prompts.append(system + tail if i % 2 else tail)
    return prompts
