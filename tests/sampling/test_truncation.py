"""Top-k / top-p / min-p support sets against the naive reference, on both paths (candidates and
full vocabulary), and the draw's frequencies against the renormalised probabilities."""

import math
import random

import pytest
import torch

from pagedcore.sampling import truncation
from pagedcore.sampling.truncation import (CandidateRound, apply_min_p, apply_top_k, apply_top_p, sample_truncated,
                                           to_weights_)

from .naive import probabilities, support

VOCAB = 300


def random_case(seed: int, num_rows: int = 12):
    rnd = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    # Scales from flat to peaked, so nuclei range from one token to most of the vocabulary.
    scale = torch.tensor([rnd.choice([0.5, 2.0, 5.0, 12.0]) for _ in range(num_rows)]).unsqueeze(1)
    logits = torch.randn(num_rows, VOCAB, generator=gen) * scale  # [R, V]
    top_k = torch.tensor([rnd.choice([0, 0, 1, 3, 20, 100, 250]) for _ in range(num_rows)])
    top_p = torch.tensor([rnd.choice([1.0, 1.0, 0.1, 0.5, 0.9, 0.99]) for _ in range(num_rows)])
    min_p = torch.tensor([rnd.choice([0.0, 0.0, 0.01, 0.2, 0.9]) for _ in range(num_rows)])
    return logits, top_k, top_p, min_p


def as_params(top_k, top_p, min_p):
    """Tensors the way SamplingMetadata stores them: top_k = vocab when off."""
    return torch.where(top_k > 0, top_k, VOCAB), top_p.float(), min_p.float()


def weights_of(logits):
    return to_weights_(logits.clone(), torch.ones(logits.shape[0]))


def reference(logits, top_k, top_p, min_p, row):
    """The naive support, less the tokens whose weight underflows float32 (probability < 1e-38 of the
    top token's): in weight space they are 0 and can never be drawn, kept or not."""
    representable = (weights_of(logits[row:row + 1])[0] > 0).nonzero().squeeze(1).tolist()
    return support(logits[row], int(top_k[row]), float(top_p[row]), float(min_p[row])) & set(representable)


@pytest.mark.parametrize("seed", range(15))
def test_full_vocabulary_masks_match_reference(seed):
    logits, top_k, top_p, min_p = random_case(seed)
    k, p, m = as_params(top_k, top_p, min_p)
    masked = weights_of(logits)
    apply_top_k(masked, k)
    apply_top_p(masked, p)
    apply_min_p(masked, m)
    for row in range(logits.shape[0]):
        got = set((masked[row] > 0).nonzero().squeeze(1).tolist())
        assert got == reference(logits, top_k, top_p, min_p, row), row


@pytest.mark.parametrize("width", [8, 32, 64])
@pytest.mark.parametrize("seed", range(15))
def test_candidate_round_matches_reference_where_it_claims_to(width, seed):
    logits, top_k, top_p, min_p = random_case(seed)
    k, p, m = as_params(top_k, top_p, min_p)
    attempt = CandidateRound(weights_of(logits), k, p, m, width)
    for row in range(logits.shape[0]):
        want = reference(logits, top_k, top_p, min_p, row)
        if attempt.resolved[row]:
            kept = attempt.keep[row] & (attempt.vals[row] > 0)
            assert set(attempt.ids[row][kept].tolist()) == want, row
        else:
            assert len(want) > width - 1 or (top_p[row] < 1 and width < k[row] < VOCAB), row


def test_every_kind_of_row_resolves_somewhere():
    logits = torch.randn(4, VOCAB) * 8
    k, p, m = as_params(torch.tensor([5, 0, 0, 0]), torch.tensor([1.0, 0.5, 1.0, 1.0]),
                        torch.tensor([0.0, 0.0, 0.5, 0.0]))
    attempt = CandidateRound(weights_of(logits), k, p, m, 64)
    # top-k fits; peaked top-p closes early; min-p 0.5 on peaked logits keeps a handful; row 3 uses nothing.
    assert attempt.resolved.tolist() == [True, True, True, False]


@pytest.mark.parametrize("widths", [(8, 32), (64,), ()])
@pytest.mark.parametrize("seed", range(6))
def test_draws_stay_inside_the_support(widths, seed):
    logits, top_k, top_p, min_p = random_case(seed, num_rows=8)
    k, p, m = as_params(top_k, top_p, min_p)
    supports = [reference(logits, top_k, top_p, min_p, row) for row in range(8)]
    torch.manual_seed(seed)
    for _ in range(10):
        tokens = sample_truncated(weights_of(logits), k, p, m, {}, widths).tolist()
        for row, token in enumerate(tokens):
            assert token in supports[row], (row, token)


def frequencies(tokens: torch.Tensor, size: int):
    return torch.bincount(tokens, minlength=size).double() / tokens.numel()


def assert_matches(freq, probs: dict[int, float], n: int):
    for token in range(freq.numel()):
        want = probs.get(token, 0.0)
        tolerance = 5 * math.sqrt(max(want * (1 - want), 1e-12) / n) + 1e-3
        assert abs(freq[token].item() - want) <= tolerance, (token, freq[token].item(), want)


@pytest.mark.parametrize("widths", [(8,), ()])
def test_truncated_frequencies_match_renormalised_probs(widths):
    """The candidate path (width 8) and the full path (no widths) draw from the same distribution."""
    n = 30000
    base = torch.randn(40, generator=torch.Generator().manual_seed(3)) * 1.5
    logits = base.expand(n, -1).clone()
    k = torch.full((n,), 5)
    p = torch.full((n,), 0.8)
    m = torch.full((n,), 0.05)
    keep = support(base, 5, 0.8, 0.05)
    assert len(keep) >= 3  # a real choice, not a forced token
    torch.manual_seed(1)
    tokens = sample_truncated(weights_of(logits), k, p.float(), m.float(), {}, widths)
    assert_matches(frequencies(tokens, 40), probabilities(base, keep), n)


def test_no_sort_when_every_row_resolves(monkeypatch):
    def forbidden(*args):
        raise AssertionError("full-vocabulary top-p sort used although the candidates settled every row")

    monkeypatch.setattr(truncation, "apply_top_p", forbidden)
    logits = torch.randn(16, 4096) * 6
    k, p, m = torch.full((16,), 4096), torch.full((16,), 0.9), torch.zeros(16)
    assert sample_truncated(weights_of(logits), k, p, m, {}).shape == (16,)
