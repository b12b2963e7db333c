"""Logprobs in multi-step scheduling (engine/multi_step.py RawRows): a sequence that wants logprobs rides the
one-call multi-step; each of its steps' logits are copied out before any edit, and the logprobs of every
kept token are the single steps' (the same raw logits, the same gather), value for value, with greedy,
sampled and penalised rows side by side and stops inside a multi-step; the declined step gives them too."""

from __future__ import annotations

import pytest

from pagedcore import SamplingParams
from tests.engine.conftest import prompts_with_shared_prefix
from tests.engine.multi_step_runs import generate
from tests.engine.test_engine_vs_hf import SETTINGS

MAX_TOKENS = 20
STEPS = 4


def params_with_logprobs() -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=3, ignore_eos=True),
        SamplingParams(temperature=0.9, seed=5, top_p=0.9, max_tokens=MAX_TOKENS - 5, logprobs=1, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),   # no logprobs beside them
        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=0, repetition_penalty=1.3, ignore_eos=True),
        SamplingParams(temperature=0.7, seed=6, max_tokens=MAX_TOKENS - 2, logprobs=5, frequency_penalty=1.0,
                       ignore_eos=True),
    ]


@pytest.mark.parametrize("setting", ["default", "chunked_prefill", "preempt_recompute"])
def test_logprobs_in_multi_steps_equal_single_steps(tiny_llama, setting):
    _, folder = tiny_llama
    prompts = prompts_with_shared_prefix(5, seed=31)
    params = params_with_logprobs()
    _, single = generate(folder, prompts, params, 1, **SETTINGS[setting])
    llm, multi = generate(folder, prompts, params, STEPS, **SETTINGS[setting])
    assert llm.llm_engine.multi_step.multi_steps > 0
    assert multi == single
    for (tokens, logprobs, _), p in zip(multi, params):
        if p.logprobs is None:
            assert logprobs is None
            continue
        assert len(logprobs) == len(tokens)
        assert all(t in entry and len(entry) >= p.logprobs for t, entry in zip(tokens, logprobs))


def test_a_stop_inside_a_multi_step_keeps_the_logprobs_of_the_kept_tokens(tiny_llama):
    _, folder = tiny_llama
    prompts = prompts_with_shared_prefix(2, seed=32)
    _, free = generate(folder, prompts, [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)] * 2, 1)
    params = [SamplingParams(temperature=0, max_tokens=12, logprobs=2, stop_token_ids=[tokens[5]])
              for tokens, _, _ in free]
    _, single = generate(folder, prompts, params, 1)
    _, multi = generate(folder, prompts, params, 8)
    assert multi == single and all(reason == "stop" for _, _, reason in multi)


def test_a_declined_step_gives_the_logprobs_too(tiny_llama, monkeypatch):
    _, folder = tiny_llama
    prompts = prompts_with_shared_prefix(5, seed=33)
    params = params_with_logprobs()
    _, single = generate(folder, prompts, params, 1)
    llm, multi = generate(folder, prompts, params, STEPS, monkeypatch=monkeypatch)
    assert multi == single
    assert llm.llm_engine.multi_step.verified_steps > 0
