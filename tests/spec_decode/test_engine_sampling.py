"""Speculation with temperature > 0 through the whole engine, and the rows that do not speculate.

- The token verified against a draft follows the target's distribution: N seeded requests of the
  tiny model, the second token's counts against its exact marginal computed with HF (every first
  token in one batched forward), chi-square.
- Seeded requests give the same tokens alone and in a crowd.
- logprobs / penalties / min_tokens rows fall back to one token per step: same output as without
  speculation.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedcore import LLM, SamplingParams
from tests.models import tiny_models

from .stats_util import chi_square_p

SPEC = {"method": "ngram", "num_speculative_tokens": 1, "disable_by_batch_size": None, "backoff_after_misses": 0}
PROMPT = [1, 17, 230, 45, 99, 310, 7, 88, 402, 150]


class FirstTokenDrafts:
    """Drafts table[t1] after the prompt and its first sampled token t1; nothing otherwise."""

    def __init__(self, table: np.ndarray):
        self.table = table

    def __call__(self, history, num_tokens, min_n, max_n):
        if history.shape[0] == len(PROMPT) + 1 and num_tokens >= 1:
            return self.table[history[-1:]]
        return history[:0]


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.8, max_tokens=3, ignore_eos=True),
                                    SamplingParams(temperature=1.0, top_p=0.9, top_k=40, max_tokens=3,
                                                   ignore_eos=True)])
def test_verified_token_follows_the_target_marginal(tiny_llama, monkeypatch, params):
    hf_model, folder = tiny_llama
    vocab = tiny_models.VOCAB_SIZE
    from .test_rejection_sampler import reference_probs
    with torch.no_grad():
        logits1 = hf_model(torch.tensor([PROMPT])).logits[0, -1]                       # [V]
        p1 = reference_probs(logits1, params)                                           # [V]
        batch = torch.tensor([PROMPT + [t] for t in range(vocab)])                     # [V, P + 1]
        logits2 = hf_model(batch).logits[:, -1]                                         # [V, V]
    p2_given = torch.stack([reference_probs(logits2[t], params) for t in range(vocab)])  # [V, V]
    marginal = (p1.unsqueeze(1) * p2_given).sum(0)                                     # [V]
    table = p2_given.argmax(-1).numpy().astype(np.int64)                              # the likeliest as draft
    monkeypatch.setattr("pagedcore.spec_decode.speculator.propose_ngram", FirstTokenDrafts(table))
    llm = LLM(folder, max_model_len=64, speculative_config=SPEC)
    n = 3000
    outs = llm.generate([{"prompt_token_ids": PROMPT}] * n,
                        [_seeded(params, i) for i in range(n)],
                        use_tqdm=False)
    spec = llm.llm_engine.speculator.stats
    assert spec.num_drafts == n                          # every request verified one draft
    assert 0.05 * n < spec.num_accepted_tokens < 0.95 * n   # both accept and residual paths ran
    second = np.bincount([o.outputs[0].token_ids[1] for o in outs], minlength=vocab)
    first = np.bincount([o.outputs[0].token_ids[0] for o in outs], minlength=vocab)
    assert chi_square_p(first, p1.numpy()) > 1e-3
    assert chi_square_p(second, marginal.numpy()) > 1e-3


def _seeded(params: SamplingParams, seed: int) -> SamplingParams:
    import dataclasses
    return dataclasses.replace(params, seed=seed)


def test_seeded_requests_repeat_alone_and_in_a_crowd(tiny_llama):
    _, folder = tiny_llama
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    llm = LLM(folder, max_model_len=128, speculative_config=spec)
    prompt = PROMPT + PROMPT[1:6] + PROMPT[1:6]
    params = SamplingParams(temperature=0.9, seed=1234, max_tokens=30, ignore_eos=True)
    alone = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0].outputs[0].token_ids
    crowd = llm.generate([{"prompt_token_ids": prompt}] + [{"prompt_token_ids": PROMPT[:5 + i]} for i in range(12)],
                         [params] + [SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True)] * 12,
                         use_tqdm=False)
    assert crowd[0].outputs[0].token_ids == alone


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=2),
    SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, repetition_penalty=1.3),
    SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, min_tokens=12, presence_penalty=0.5),
])
def test_rows_that_need_the_sampler_fall_back_and_match(tiny_llama, params):
    _, folder = tiny_llama
    prompts = [PROMPT + PROMPT[2:8] * 2, PROMPT[3:] * 3]
    runs = []
    for spec in (None, {"method": "ngram", "num_speculative_tokens": 4, "backoff_after_misses": 0}):
        llm = LLM(folder, max_model_len=128, speculative_config=spec)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts] * 2,
                            [params, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)] * 2,
                            use_tqdm=False)
        runs.append([(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs])
    assert runs[0] == runs[1]
