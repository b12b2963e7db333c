"""Draft acceptance: greedy is the argmax prefix; random rows keep the target's distribution.

Statistical tests: many seeded draws, Pearson chi-square against the target's probabilities, with
a negative control showing the test can tell a biased sampler apart.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedcore.sampling_params import SamplingParams
from pagedcore.spec_decode.rejection_sampler import accept_greedy, accept_random, target_probs

from .stats_util import chi_square_p


def test_accept_greedy_is_the_matching_prefix_then_the_target_token():
    assert accept_greedy(np.array([5, 6, 7, 8]), np.array([5, 6, 7])).tolist() == [5, 6, 7, 8]  # + bonus
    assert accept_greedy(np.array([5, 9, 7, 8]), np.array([5, 6, 7])).tolist() == [5, 9]
    assert accept_greedy(np.array([1, 6, 7, 8]), np.array([5, 6, 7])).tolist() == [1]


def reference_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The sampler's distribution written out plainly: temperature, top-k, top-p (renormalised over
    top-k, a token stays while the mass strictly above it < top_p), min-p."""
    probs = torch.softmax(logits.double() / p.temperature, dim=-1)
    order = probs.argsort(descending=True)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    k = p.top_k if p.top_k > 0 else probs.shape[0]
    mass_above = 0.0
    kept_total = probs[order[:k]].sum()
    for rank, tok in enumerate(order.tolist()):
        if rank >= k:
            break
        if mass_above / kept_total >= p.top_p:
            break
        keep[tok] = True
        mass_above += float(probs[tok])
    keep &= probs >= p.min_p * probs.max()
    out = torch.where(keep, probs, torch.zeros_like(probs))
    return out / out.sum()


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=8),
                                    SamplingParams(temperature=1.3, top_p=0.8, min_p=0.05)])
def test_target_probs_equal_the_plain_reference(params):
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(1)) * 2
    got = target_probs(logits.clone(), [params] * 3)
    for r in range(3):
        torch.testing.assert_close(got[r].double(), reference_probs(logits[r], params), atol=1e-6, rtol=1e-5)


def draw(probs, drafts, num, seed, sampler=accept_random):
    g = torch.Generator().manual_seed(seed)
    return [sampler(probs, drafts, g).tolist() for _ in range(num)]


def biased_accept(probs, drafts, generator):
    """A wrong sampler: on rejection it redraws from p itself, not from the residual."""
    u = torch.rand(1, generator=generator)
    if u < probs[0, drafts[0]]:
        return np.array([drafts[0]])
    return np.array([int(torch.multinomial(probs[0], 1, generator=generator))])


@pytest.mark.parametrize("draft_rank", [0, 3])  # the target's favourite token as draft, and a poor one
def test_emitted_tokens_follow_the_target_distribution(draft_rank):
    vocab = 24
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(7)) * 1.5
    params = SamplingParams(temperature=1.0, top_k=12)
    probs = target_probs(logits.clone(), [params] * 3)                     # [3, V]
    drafts = np.array([int(probs[0].argsort(descending=True)[draft_rank]),
                       int(probs[1].argsort(descending=True)[0])])
    samples = draw(probs, drafts, 20000, seed=draft_rank)
    first = np.bincount([s[0] for s in samples], minlength=vocab)
    assert chi_square_p(first, probs[0].double().numpy()) > 1e-3
    # Given d1 was emitted (accepted or drawn), the next token follows row 1.
    second = np.bincount([s[1] for s in samples if len(s) > 1], minlength=vocab)
    assert second.sum() > 1000
    assert chi_square_p(second, probs[1].double().numpy()) > 1e-3
    # Negative control: the test detects a sampler that skips the residual.
    biased = np.bincount([s[0] for s in draw(probs, drafts, 20000, 5, biased_accept)], minlength=vocab)
    assert chi_square_p(biased, probs[0].double().numpy()) < 1e-6


def test_seeded_draws_repeat():
    probs = torch.softmax(torch.randn(4, 30, generator=torch.Generator().manual_seed(3)), dim=-1)
    drafts = np.array([1, 2, 3])
    assert draw(probs, drafts, 50, seed=11) == draw(probs, drafts, 50, seed=11)
