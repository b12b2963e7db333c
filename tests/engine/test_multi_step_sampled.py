"""Sampled rows in multi-step scheduling (engine/multi_step.py, RowSampling.draw_step_noise): a sequence
sampled by temperature / top-k / top-p / min-p rides the one-call multi-step like a greedy one, and its
tokens are the single steps' bit for bit: always for seeded requests, and for unseeded ones under
torch.manual_seed while no sequence stops before its last step of a multi-step (each step's noise is drawn
as that single step draws it). Mixed greedy and sampled batches, every scheduling setting, stops inside a
multi-step, and the fallback verification of a step the call declines."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedcore import SamplingParams
from pagedcore.sampling.noise import exponential_noise
from pagedcore.sampling.row_sampling import RowSampling
from tests.engine.conftest import prompts_with_shared_prefix
from tests.engine.multi_step_runs import generate
from tests.engine.test_engine_vs_hf import SETTINGS   # every scheduling setting the HF test holds

MAX_TOKENS = 24
STEPS = 4


def mixed_params(num: int, max_tokens: int = MAX_TOKENS, **kw) -> list[SamplingParams]:
    """Seeded and unseeded sampled rows with each truncation, and greedy rows; lengths differ so that
    sequences leave at different steps of a multi-step."""
    kinds = [dict(temperature=0.8, top_p=0.9, seed=1), dict(temperature=1.0, top_k=20),
             dict(temperature=0.7, min_p=0.05, seed=2), dict(temperature=0.0),
             dict(temperature=1.3, seed=3), dict(temperature=0.9, top_p=0.95, top_k=50),
             dict(temperature=1.0, seed=4, top_k=5, top_p=0.8, min_p=0.01), dict(temperature=0.6)]
    return [SamplingParams(max_tokens=max_tokens - (i % 5), **kinds[i % len(kinds)], **kw) for i in range(num)]


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_sampled_multi_step_equals_single_steps(tiny_llama, setting):
    _, folder = tiny_llama
    prompts = prompts_with_shared_prefix(8, seed=5)
    params = mixed_params(8, ignore_eos=True)
    _, single = generate(folder, prompts, params, 1, **SETTINGS[setting])
    llm, multi = generate(folder, prompts, params, STEPS, **SETTINGS[setting])
    assert multi == single
    assert llm.llm_engine.multi_step.multi_steps > 0
    # The sampled rows were drawn, not their argmaxes (a greedy run of the same prompts differs there).
    _, greedy = generate(folder, prompts, [SamplingParams(temperature=0, max_tokens=p.max_tokens, ignore_eos=True)
                                      for p in params], 1, **SETTINGS[setting])
    assert all(m != g for m, g, p in zip(multi, greedy, params) if p.temperature > 0)
    assert all(m == g for m, g, p in zip(multi, greedy, params) if p.temperature == 0)


def test_sampled_only_batches_run_multi_steps(tiny_llama):
    """Every row sampled (no greedy row in the batch): multi-steps still run, fewer steps than tokens."""
    _, folder = tiny_llama
    prompts = prompts_with_shared_prefix(3, seed=8)
    params = [SamplingParams(temperature=0.9, top_p=0.9, seed=10 + i, max_tokens=MAX_TOKENS, ignore_eos=True)
              for i in range(3)]
    _, single = generate(folder, prompts, params, 1)
    llm, multi = generate(folder, prompts, params, 8)
    assert multi == single
    ms = llm.llm_engine.multi_step
    assert ms.multi_steps > 0 and ms.multi_steps < MAX_TOKENS // 2


def test_seeded_rows_stopping_inside_a_multi_step_keep_the_single_steps_tokens(tiny_llama):
    """Stop ids and EOS reached inside a multi-step: seeded requests still get the single steps' tokens
    and finish reasons (an unseeded row's later draws may shift then, as the module docstring says)."""
    _, folder = tiny_llama
    prompts = prompts_with_shared_prefix(6, seed=9)
    seeded = [SamplingParams(temperature=0.9, top_p=0.95, seed=20 + i, max_tokens=MAX_TOKENS) for i in range(6)]
    _, free = generate(folder, prompts, seeded, 1)
    # a stop id from the middle of each free run's tokens, so stops land inside multi-steps
    params = [SamplingParams(temperature=0.9, top_p=0.95, seed=20 + i, max_tokens=MAX_TOKENS,
                             stop_token_ids=[toks[5 + i]]) for i, (toks, _, _) in enumerate(free)]
    _, single = generate(folder, prompts, params, 1)
    llm, multi = generate(folder, prompts, params, STEPS)
    assert multi == single
    assert sum(reason == "stop" for _, _, reason in multi) >= 4
    assert llm.llm_engine.multi_step.multi_steps > 0


def test_a_declined_sampled_step_samples_its_first_rows_as_single_steps(tiny_llama, monkeypatch):
    """The worker refuses the one call: the placeholders go through the forward, and each sequence keeps
    its first row's token, sampled with a single step's noise: the single steps' tokens, one a step."""
    _, folder = tiny_llama
    prompts = prompts_with_shared_prefix(4, seed=12)
    params = mixed_params(4, ignore_eos=True)
    _, single = generate(folder, prompts, params, 1)
    llm, declined = generate(folder, prompts, params, STEPS, monkeypatch=monkeypatch)
    assert declined == single
    ms = llm.llm_engine.multi_step
    assert ms.multi_steps == 0 and ms.verified_steps > 0


def test_the_cpu_sampler_switched_off_keeps_sampled_rows_single_step(tiny_llama, monkeypatch):
    """PAGEDCORE_CPU_SAMPLER=0 (the torch sampler): sampled rows are not plain decodes for multi-step."""
    _, folder = tiny_llama
    monkeypatch.setenv("PAGEDCORE_CPU_SAMPLER", "0")
    prompts = prompts_with_shared_prefix(2, seed=13)
    params = [SamplingParams(temperature=0.9, seed=5, max_tokens=8, ignore_eos=True)] * 2
    llm, _ = generate(folder, prompts, params, STEPS)
    assert llm.llm_engine.multi_step.multi_steps == 0


def test_draw_step_noise_draws_each_step_as_a_single_step():
    """Row query_start_loc[r] + i is row r's step i: seeded rows from their own generator in step order,
    unseeded rows from the global generator in the order single steps draw them; greedy-only steps draw
    nothing."""
    vocab = 1000
    params = [SamplingParams(temperature=0.8, seed=3), SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.0)]
    gens = [torch.Generator().manual_seed(3), None, None]
    qsl = np.array([0, 3, 7, 8])                    # row 0 steps 3 times, row 1 (greedy) 4, row 2 once
    sampling = RowSampling.from_params(params, gens, vocab)
    torch.manual_seed(7)
    noise = sampling.draw_step_noise(qsl)           # [8, W]
    # the single steps' draws: step 0 rows (0, 1, 2), steps 1-2 rows (0, 1), step 3 row 1 alone (greedy)
    seeded = torch.Generator().manual_seed(3)
    torch.manual_seed(7)
    step0 = exponential_noise(3, sampling.noise_width, {0: seeded})
    step1 = exponential_noise(2, sampling.noise_width, {0: seeded})
    step2 = exponential_noise(2, sampling.noise_width, {0: seeded})
    assert torch.equal(noise[[0, 3, 7]], step0)
    assert torch.equal(noise[[1, 4]], step1) and torch.equal(noise[[2, 5]], step2)
    assert torch.count_nonzero(noise[6]) == 0       # row 1's step 3: only greedy rows step, nothing drawn
    after = torch.rand(1)
    torch.manual_seed(7)
    for _ in range(3):
        exponential_noise(3 if _ == 0 else 2, sampling.noise_width, {})
    assert torch.equal(torch.rand(1), after)        # the global generator advanced exactly as single steps
