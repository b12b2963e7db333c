"""Fixtures for speculative decoding tests: the tiny random Llama of the engine tests, and an oracle
proposer that drafts from known greedy continuations (a random model rarely repeats itself, so
n-gram drafts alone would hardly ever be accepted and the acceptance paths would go untested)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.engine.conftest import tiny_llama  # noqa: F401  (the session fixture, shared)


class OracleProposer:
    """Drafts the true greedy continuation of a known prompt, then corrupts it deterministically:
    the draft at position `wrong_at(history length)` is replaced by a wrong token, so verification
    accepts 0..K drafts in turn and rejects the rest."""

    def __init__(self, prompts: list[list[int]], continuations: list[list[int]], vocab_size: int):
        self.known = [(np.asarray(p, dtype=np.int64), np.asarray(c, dtype=np.int64))
                      for p, c in zip(prompts, continuations)]
        self.vocab_size = vocab_size
        self.calls = 0

    def __call__(self, history: np.ndarray, num_tokens: int, min_n: int, max_n: int) -> np.ndarray:
        self.calls += 1
        for prompt, cont in self.known:
            n = prompt.shape[0]
            if history.shape[0] >= n and np.array_equal(history[:n], prompt) \
                    and np.array_equal(history[n:], cont[:history.shape[0] - n]):
                done = history.shape[0] - n
                drafts = cont[done:done + num_tokens].copy()
                wrong_at = (history.shape[0] * 7) % (num_tokens + 2)   # == len: all right
                if wrong_at < drafts.shape[0]:
                    drafts[wrong_at] = (drafts[wrong_at] + 1 + done) % self.vocab_size
                return drafts
        return history[:0]


@pytest.fixture
def oracle(monkeypatch):
    """Installs an OracleProposer as the engine's proposer: oracle(prompts, continuations, vocab)."""
    def install(prompts, continuations, vocab_size):
        proposer = OracleProposer(prompts, continuations, vocab_size)
        monkeypatch.setattr("pagedcore.spec_decode.speculator.propose_ngram", proposer)
        return proposer
    return install
