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


def _noisy_copy(hf_model, scale: float, seed: int):
    """The target's weights with Gaussian noise (scale x each tensor's std): a draft that agrees with
    the target often but not always."""
    import copy

    import torch

    draft = copy.deepcopy(hf_model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.add_(torch.randn(p.shape, generator=g) * p.std() * scale)
    return draft


@pytest.fixture(scope="session")
def draft_folders(tiny_llama, tmp_path_factory):
    """HF folders of draft models for the tiny target (all with its 512-token vocabulary):
    "self" (the target itself), "noisy" (its weights + noise: partial acceptance), "random" (an
    unrelated random Qwen3: other head_dim and KV heads, so its cache has its own shape)."""
    from tests.models import tiny_models

    hf_model, folder = tiny_llama
    noisy = tiny_models.save_hf_folder(_noisy_copy(hf_model, 0.02, seed=11), tmp_path_factory.mktemp("draft_noisy"))
    other = tiny_models.save_hf_folder(tiny_models.build_hf_model("qwen3", seed=3),
                                       tmp_path_factory.mktemp("draft_random"))
    return {"self": folder, "noisy": noisy, "random": other}
