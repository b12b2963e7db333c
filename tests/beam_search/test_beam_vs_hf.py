"""Beam search against HF transformers' generate(num_beams=W, num_return_sequences=W, do_sample=False)
on the same fp32 weights: the same beams (token ids), in the same order, with the same cumulative
logprobs (to 1e-4), for W in {2, 4}, with EOS inside and outside the window, and HF's length penalty
and early_stopping rules."""

from __future__ import annotations

import pytest

from pagedcore import LLM, SamplingParams
from pagedcore.sampling_params import BeamSearchParams

from .conftest import hf_beam_search, held_prompts

MAX_TOKENS = 12


def assert_same_beams(got, expected, prompt):
    assert len(got.sequences) == len(expected)
    for ours, ref in zip(got.sequences, expected):
        assert ours.tokens[:len(prompt)] == prompt
        assert ours.tokens[len(prompt):] == ref.token_ids
        assert ours.cum_logprob == pytest.approx(ref.cumulative_logprob, abs=1e-4)


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(tiny_llama[1], max_model_len=256)


@pytest.fixture(scope="module")
def llm_eos(tiny_llama_eos):
    return LLM(tiny_llama_eos[1], max_model_len=256)


@pytest.mark.parametrize("beam_width", [2, 4])
@pytest.mark.parametrize("length_penalty", [1.0, 0.0, 2.0])
def test_eos_outside_window_equals_hf(tiny_llama, llm, beam_width, length_penalty):
    hf_model, _ = tiny_llama
    prompts = held_prompts()
    params = BeamSearchParams(beam_width=beam_width, max_tokens=MAX_TOKENS, length_penalty=length_penalty)
    outputs = llm.beam_search([{"prompt_token_ids": p} for p in prompts], params)
    for prompt, got in zip(prompts, outputs):
        expected = hf_beam_search(hf_model, prompt, beam_width, MAX_TOKENS, [2], length_penalty)
        assert all(len(b.token_ids) == MAX_TOKENS for b in expected), "EOS was meant to stay outside the window"
        assert_same_beams(got, expected, prompt)
        assert all(s.finish_reason == "length" for s in got.sequences)
    assert llm.llm_engine.scheduler.stats().num_free_blocks == llm.llm_engine.scheduler.config.num_gpu_blocks


@pytest.mark.parametrize("beam_width", [2, 4])
@pytest.mark.parametrize("length_penalty,early_stopping",
                         [(1.0, False), (1.0, True), (1.0, "never"), (0.0, False), (2.0, "never"), (-1.0, False)])
def test_eos_inside_window_equals_hf(tiny_llama_eos, llm_eos, beam_width, length_penalty, early_stopping):
    hf_model, _, eos = tiny_llama_eos
    prompts = held_prompts()
    params = BeamSearchParams(beam_width=beam_width, max_tokens=MAX_TOKENS, length_penalty=length_penalty,
                              early_stopping=early_stopping)
    outputs = llm_eos.beam_search([{"prompt_token_ids": p} for p in prompts], params)
    num_ended = 0
    for prompt, got in zip(prompts, outputs):
        expected = hf_beam_search(hf_model, prompt, beam_width, MAX_TOKENS, [eos], length_penalty, early_stopping)
        assert_same_beams(got, expected, prompt)
        for s in got.sequences:
            ended = s.tokens[-1] == eos and len(s.tokens) - len(prompt) < MAX_TOKENS
            assert s.finish_reason == ("stop" if s.tokens[-1] == eos else "length")
            num_ended += ended
    if length_penalty <= 1.0:   # a longer penalty-favoured hypothesis may outscore every early end
        assert num_ended > 0, "some hypotheses were meant to end with EOS inside the window"
    scheduler = llm_eos.llm_engine.scheduler
    assert scheduler.stats().num_free_blocks == scheduler.config.num_gpu_blocks


def test_ignore_eos_runs_through_eos(tiny_llama_eos, llm_eos):
    """ignore_eos: EOS is an ordinary token, as HF without an EOS id."""
    hf_model, _, eos = tiny_llama_eos
    prompt = held_prompts()[0]
    got = llm_eos.beam_search([prompt], BeamSearchParams(beam_width=4, max_tokens=MAX_TOKENS, ignore_eos=True))[0]
    expected = hf_beam_search(hf_model, prompt, 4, MAX_TOKENS, [])
    assert_same_beams(got, expected, prompt)
    assert any(eos in s.tokens[len(prompt):] for s in got.sequences), "EOS was meant to occur inside the beams"


def test_beam_width_one_is_greedy(tiny_llama, llm):
    hf_model, _ = tiny_llama
    prompt = held_prompts()[1]
    got = llm.beam_search([prompt], BeamSearchParams(beam_width=1, max_tokens=MAX_TOKENS))[0]
    greedy = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=MAX_TOKENS),
                          use_tqdm=False)[0]
    assert got.sequences[0].tokens[len(prompt):] == greedy.outputs[0].token_ids
