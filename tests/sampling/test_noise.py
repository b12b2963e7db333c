"""The exponential race and its two-level form against the softmax they should sample from."""

import math

import pytest
import torch

from pagedcore.sampling.noise import BLOCK_SIZE, block_race, exponential_noise, exponential_race


def assert_frequencies(tokens: torch.Tensor, probs: torch.Tensor):
    n = tokens.numel()
    freq = torch.bincount(tokens, minlength=probs.numel()).double() / n
    for token, want in enumerate(probs.tolist()):
        tolerance = 5 * math.sqrt(max(want * (1 - want), 1e-12) / n) + 1e-3
        assert abs(freq[token].item() - want) <= tolerance, (token, freq[token].item(), want)


def test_exponential_race_matches_softmax():
    n, logits = 40000, torch.tensor([1.0, 0.0, -1.0, 2.0, -30.0, 0.5])
    torch.manual_seed(0)
    tokens = exponential_race(torch.softmax(logits, 0).expand(n, -1).clone(), {})
    assert_frequencies(tokens, torch.softmax(logits.double(), 0))


@pytest.mark.parametrize("vocab_size", [7, BLOCK_SIZE, 2 * BLOCK_SIZE + 88, 3 * BLOCK_SIZE])
def test_block_race_matches_softmax(vocab_size):
    """Including a vocabulary smaller than a block and one with a short tail block."""
    n = 20000
    gen = torch.Generator().manual_seed(vocab_size)
    logits = torch.randn(vocab_size, generator=gen) * 3
    logits[-1] = logits.max() + 1.5  # the tail block holds the favourite
    # Coarse buckets keep the test's statistical power with hundreds of tokens.
    weights = torch.exp(logits - logits.max()).expand(n, -1).clone()
    torch.manual_seed(1)
    tokens = block_race(weights, {})
    assert tokens.min() >= 0 and tokens.max() < vocab_size
    probs = torch.softmax(logits.double(), 0)
    buckets = torch.arange(vocab_size) * 8 // vocab_size  # [V] -> 8 buckets
    bucket_probs = torch.zeros(8, dtype=torch.float64).index_add_(0, buckets, probs)
    assert_frequencies(buckets[tokens], bucket_probs)
    assert_frequencies((tokens == vocab_size - 1).long(), torch.tensor([1 - probs[-1], probs[-1]]))


def test_block_race_never_draws_a_zero_weight():
    weights = torch.zeros(500, 1000)
    weights[:, [3, 300, 999]] = torch.tensor([1.0, 1e-30, 0.5])
    assert set(block_race(weights, {}).tolist()) <= {3, 300, 999}


def test_seeded_rows_draw_their_own_noise():
    def draw(seed_rows: dict[int, int], num_rows: int):
        gens = {row: torch.Generator().manual_seed(seed) for row, seed in seed_rows.items()}
        return exponential_noise(num_rows, 16, gens)

    alone = draw({0: 5}, 1)[0]
    assert torch.equal(draw({3: 5, 1: 9}, 6)[3], alone)
    assert (draw({}, 2) > 0).all()
