"""propose_ngram against a plain-Python reference of prompt lookup, on histories with repeats."""

from __future__ import annotations

import numpy as np
import pytest

from pagedcore.spec_decode.ngram_proposer import propose_ngram


def reference(history: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Longest suffix n-gram (max_n down to min_n) found earlier; the latest such match wins."""
    L = len(history)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        suffix = history[L - n:]
        for start in range(L - n - 1, -1, -1):          # match ends before the last token
            if history[start:start + n] == suffix:
                return history[start + n:start + n + k]
    return []


def test_examples():
    h = np.array([5, 6, 7, 8, 9, 5, 6, 7])
    assert propose_ngram(h, 3, 1, 3).tolist() == [8, 9, 5]
    assert propose_ngram(h, 10, 1, 3).tolist() == [8, 9, 5, 6, 7]   # runs to the end of the history
    assert propose_ngram(np.array([1, 2, 3]), 3, 1, 3).tolist() == []
    assert propose_ngram(np.array([4, 4, 4]), 2, 1, 2).tolist() == [4]  # latest longest match (j = 1)
    # min_n = 2: a single-token match is not enough
    assert propose_ngram(np.array([1, 9, 2, 3, 9]), 2, 2, 3).tolist() == []
    assert propose_ngram(np.array([1, 9, 2, 3, 9]), 2, 1, 3).tolist() == [2, 3]


@pytest.mark.parametrize("seed", range(40))
def test_matches_reference_on_random_histories(seed):
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(2, 12))                    # small vocabularies: many partial matches
    h = rng.integers(0, vocab, int(rng.integers(1, 80))).tolist()
    min_n = int(rng.integers(1, 4))
    max_n = min_n + int(rng.integers(0, 4))
    k = int(rng.integers(1, 8))
    assert propose_ngram(np.asarray(h, dtype=np.int64), k, min_n, max_n).tolist() == reference(h, k, min_n, max_n)
