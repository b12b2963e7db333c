"""Logit edits in multi-step scheduling (engine/multi_step.py, cpp/kernels/multi_step_edits.h): rows with
repetition / presence / frequency penalties, a logit bias or min_tokens ride the one-call multi-step, each
step's edits being the first step's advanced by the tokens chosen, so the tokens, texts and finish
reasons are the single steps' in every scheduling setting; the declined step edits its first rows as a
single step does."""

from __future__ import annotations

import pytest

from pagedcore import SamplingParams
from tests.engine.conftest import prompts_with_shared_prefix
from tests.engine.multi_step_runs import generate
from tests.engine.test_engine_vs_hf import SETTINGS   # every scheduling setting the HF test holds

MAX_TOKENS = 32
STEPS = 8


def edited_params(stop_id: int) -> list[SamplingParams]:
    """Each edit alone and mixed, greedy and sampled; min_tokens holding back a stop id the row would
    otherwise pick early (and EOS), then letting it stop. (Rows 1 and 2 repeat tokens inside 8-step
    windows on this model: a multi-step that did not count its own tokens would differ there.)"""
    return [
        SamplingParams(temperature=0, max_tokens=MAX_TOKENS - 3, logit_bias={stop_id: 3.0, 7: -2.0}, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, repetition_penalty=1.3, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, frequency_penalty=1.5, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, min_tokens=9, stop_token_ids=[stop_id]),
        SamplingParams(temperature=1.0, seed=2, top_k=30, max_tokens=MAX_TOKENS, repetition_penalty=1.2,
                       frequency_penalty=0.4, min_tokens=5, stop_token_ids=[stop_id], ignore_eos=True),
        SamplingParams(temperature=0.8, seed=1, max_tokens=MAX_TOKENS, presence_penalty=2.0, frequency_penalty=2.0,
                       ignore_eos=True),
    ]


@pytest.fixture(scope="module")
def prompts_and_stop(tiny_llama):
    _, folder = tiny_llama
    prompts = prompts_with_shared_prefix(6, seed=21)
    # a token the plain greedy runs pick early: min_tokens must hold it back, the bias must push it
    _, plain = generate(folder, prompts, [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)] * 6, 1)
    return prompts, plain[3][0][2]


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_edited_rows_in_multi_steps_equal_single_steps(tiny_llama, prompts_and_stop, setting):
    _, folder = tiny_llama
    prompts, stop_id = prompts_and_stop
    params = edited_params(stop_id)
    _, single = generate(folder, prompts, params, 1, **SETTINGS[setting])
    llm, multi = generate(folder, prompts, params, STEPS, **SETTINGS[setting])
    assert multi == single
    assert llm.llm_engine.multi_step.multi_steps > 0
    tokens, _, reason = multi[3]
    assert len(tokens) >= 9 and stop_id not in tokens[:8]   # min_tokens held the stop id back ...
    assert reason == "stop" or len(tokens) == MAX_TOKENS      # ... and let it stop afterwards


def test_the_penalties_change_the_tokens_they_should(tiny_llama, prompts_and_stop):
    """The same requests without their edits give other tokens: the edits were applied at every step."""
    _, folder = tiny_llama
    prompts, stop_id = prompts_and_stop
    params = edited_params(stop_id)
    _, edited = generate(folder, prompts, params, STEPS)
    plain = [SamplingParams(temperature=p.temperature, seed=p.seed, top_k=p.top_k, max_tokens=p.max_tokens,
                            ignore_eos=True) for p in params]
    _, unedited = generate(folder, prompts, plain, STEPS)
    for i in (0, 1, 2, 5):
        tokens = unedited[i][0]
        if i == 5 and len(set(tokens)) == len(tokens):
            continue  # presence / frequency penalise repeats only: a run without any changes nothing
        assert edited[i][0] != tokens, f"row {i}: its edits changed nothing"


def test_a_declined_edited_step_edits_its_first_rows(tiny_llama, prompts_and_stop, monkeypatch):
    _, folder = tiny_llama
    prompts, stop_id = prompts_and_stop
    params = edited_params(stop_id)
    _, single = generate(folder, prompts, params, 1)
    llm, declined = generate(folder, prompts, params, STEPS, monkeypatch=monkeypatch)
    assert declined == single
    ms = llm.llm_engine.multi_step
    assert ms.multi_steps == 0 and ms.verified_steps > 0


def test_fused_edits_switched_off_keep_edited_rows_single_step(tiny_llama, prompts_and_stop, monkeypatch):
    _, folder = tiny_llama
    monkeypatch.setenv("PAGEDCORE_FUSED_LOGIT_EDITS", "0")
    prompts, _ = prompts_and_stop
    params = [SamplingParams(temperature=0, max_tokens=8, repetition_penalty=1.2, ignore_eos=True)] * 2
    llm, _ = generate(folder, prompts[:2], params, STEPS)
    assert llm.llm_engine.multi_step.multi_steps == 0
