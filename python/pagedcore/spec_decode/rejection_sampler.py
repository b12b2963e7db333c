"""Accepting drafts: the target's tokens for one sequence's k + 1 logits rows.

Rows r_0 .. r_k of a sequence with drafts d_1 .. d_k: row r_i is the target's distribution for the
position of d_{i+1} (r_k: the bonus position after the last draft).

- Greedy: the longest prefix of drafts equal to the target's argmax, then the argmax at the first
  mismatch (or the bonus argmax): exactly the tokens plain greedy decoding would produce.
- Random (temperature > 0): the n-gram draft is a point mass q = onehot(d). Accept d_{i+1} with
  probability min(1, p_i(d) / q(d)) = p_i(d); on rejection draw from the residual
  (p_i - q)+ / Z = p_i with d zeroed, renormalised; with all k accepted draw the bonus from p_k.
  Every emitted token is then distributed exactly as the target's sample would be (Leviathan et al.
  2023, the speculative sampling theorem), and each uses the target's own p_i: the temperature,
  top-k, top-p and min-p the Sampler applies (its full-vocabulary masks, same semantics).

Randomness per sequence: k uniforms, then one categorical draw, from the sequence's own generator
when seeded (the global one otherwise): a seeded request draws the same numbers in any batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from pagedcore.sampling.truncation import apply_min_p, apply_top_k, apply_top_p, to_weights_
from pagedcore.sampling_params import SamplingParams


def accept_greedy(target_argmax: np.ndarray, drafts: np.ndarray) -> np.ndarray:
    """target_argmax int64 [k + 1], drafts int64 [k] -> accepted tokens int64 [a + 1]
    (a accepted drafts, then the target's own token)."""
    k = drafts.shape[0]
    mismatch = np.flatnonzero(target_argmax[:k] != drafts)       # [<= k]
    a = int(mismatch[0]) if mismatch.size else k
    return np.concatenate([drafts[:a], target_argmax[a:a + 1]])


def target_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """logits fp32 [R, V] (consumed) of random rows, params [R] (temperature > 0) -> probs [R, V],
    the distribution the Sampler draws from for each row."""
    vocab_size = logits.shape[1]
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=logits.device)  # [R]
    weights = to_weights_(logits, temperature)                                    # [R, V]
    if any(p.has_truncation for p in params):
        top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab_size for p in params], device=logits.device)  # [R]
        top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=logits.device)            # [R]
        min_p = torch.tensor([p.min_p for p in params], dtype=torch.float32, device=logits.device)            # [R]
        apply_top_k(weights, top_k)
        apply_top_p(weights, top_p)
        if bool((min_p > 0).any()):
            apply_min_p(weights, min_p)
    return weights.div_(weights.sum(dim=-1, keepdim=True))


def accept_random(probs: torch.Tensor, drafts: np.ndarray, generator: torch.Generator | None) -> np.ndarray:
    """probs [k + 1, V] (the target's, per row), drafts int64 [k] -> accepted tokens int64 [a + 1]."""
    k = drafts.shape[0]
    draft_ids = torch.from_numpy(drafts).to(probs.device)                          # [k]
    p_draft = probs[torch.arange(k, device=probs.device), draft_ids]              # [k]
    u = torch.rand(k, generator=generator, device=probs.device)                   # [k]
    rejected = torch.nonzero(u >= p_draft).flatten()                              # u in [0, 1): p = 1 always accepts
    a = int(rejected[0]) if rejected.numel() else k
    last = probs[a].clone()                                                       # [V]
    if a < k:
        last[draft_ids[a]] = 0.0                                                  # the residual (p - onehot(d))+
    token = torch.multinomial(last, 1, generator=generator)                       # [1], renormalises itself
    return np.concatenate([drafts[:a], token.cpu().numpy().astype(np.int64)])
