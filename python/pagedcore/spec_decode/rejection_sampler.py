"""Accepting drafts: the target's tokens for one sequence's k + 1 logits rows.

Rows r_0 .. r_k of a sequence with drafts d_1 .. d_k: row r_i is the target's distribution for the
position of d_{i+1} (r_k: the bonus position after the last draft).

- Greedy: the longest prefix of drafts equal to the target's argmax, then the argmax at the first
  mismatch (or the bonus argmax): exactly the tokens plain greedy decoding would produce.
- Random (temperature > 0): accept d_{i+1} with probability min(1, p_i(d) / q_i(d)); on rejection
  draw from the residual (p_i - q_i)+ / Z; with all k accepted draw the bonus from p_k. A draft
  model's q_i is its own distribution (the same temperature / top-k / top-p / min-p, d drawn from
  it); an n-gram draft is a point mass q = onehot(d): accept with p_i(d), residual = p_i with d
  zeroed, renormalised.
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


def accept_random(probs: torch.Tensor, drafts: np.ndarray, generator: torch.Generator | None,
                  draft_probs: torch.Tensor | None = None) -> np.ndarray:
    """probs [k + 1, V] (the target's, per row), drafts int64 [k], draft_probs [k, V] (q of a draft
    model, on probs' device; None: n-gram point masses) -> accepted tokens int64 [a + 1]."""
    k = drafts.shape[0]
    draft_ids = torch.from_numpy(drafts).to(probs.device)                          # [k]
    rows = torch.arange(k, device=probs.device)                                   # [k]
    ratio = probs[rows, draft_ids]                                                # [k] p(d) / q(d), q(d) = 1
    if draft_probs is not None:
        ratio = ratio / draft_probs[rows, draft_ids]                              # q(d) > 0: d was drawn from q
    u = torch.rand(k, generator=generator, device=probs.device)                   # [k]
    rejected = torch.nonzero(u >= ratio).flatten()                                # u in [0, 1): ratio >= 1 accepts
    a = int(rejected[0]) if rejected.numel() else k
    last = probs[a].clone()                                                       # [V]
    if a < k:
        if draft_probs is None:
            last[draft_ids[a]] = 0.0                                              # the residual (p - onehot(d))+
        else:
            last.sub_(draft_probs[a]).clamp_(min=0.0)                             # the residual (p - q)+
            if not bool(last.sum() > 0):
                # p <= q everywhere means p == q, where a rejection has probability 0; a rounding
                # rejection then draws from p itself (the residual's limit).
                last = probs[a].clone()
    token = torch.multinomial(last, 1, generator=generator)                       # [1], renormalises itself
    return np.concatenate([drafts[:a], token.cpu().numpy().astype(np.int64)])
