"""Temperature, top-k, top-p and min-p, and the random draw for the rows that use them: the torch
stages, for logits off the CPU (or PAGEDCORE_CPU_SAMPLER=0). CPU logits are sampled by the C++
kernel (cpp/kernels/sample_rows.h), which draws from the same distribution with the same noise
layout for untruncated rows; for truncated rows it races over the whole kept set instead of the
candidates, and top-p keeps equal weights together (this module's sort keeps them in sort order).

Everything here works on weights w = exp((logit - max) / temperature), computed in place: the
softmax numerator, with the row's largest weight exactly 1. That saves the [rows, vocab]
temporaries of softmax/logsumexp (fresh allocations cost more than the arithmetic on CPU) and
makes min-p a plain compare: prob / max prob = w.

Semantics (vLLM's): top-k keeps the k largest; top-p then keeps the smallest set of most likely
tokens whose probability, renormalised over what top-k kept, reaches top_p (a token stays while the
mass strictly above it is < top_p); min-p keeps tokens with prob >= min_p * max prob.

Speed: sorting [rows, 49152] costs ~2 ms a row on CPU, so truncated rows first try a short list of
candidates, topk(width) of the row. A row whose kept set provably lies inside its candidates
("resolved") is sampled there; the rest retry wider, and the few left get full-vocabulary masks
(sort included). Which path a row takes depends only on its own logits and params, so a seeded row
is reproducible whatever shares its batch.
"""

from __future__ import annotations

import torch

from pagedcore.sampling.noise import block_race, exponential_race, subset_generators
from pagedcore.sampling.workspace import RowBuffers

# Candidate widths tried in turn: 64 covers top-k <= 64 and confident nuclei, 1024 nearly every
# top-p <= 0.95 nucleus of a real LM; what is left is sorted.
CANDIDATE_WIDTHS = (64, 1024)


def to_weights_(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """In place: logits [M, V] -> exp((logits - max) / temperature) [M, V]; temperature [M] > 0."""
    return logits.sub_(logits.amax(dim=-1, keepdim=True)).div_(temperature.unsqueeze(1)).exp_()


class CandidateRound:
    """One try at width C over rows [T]: the candidates and which rows they settle."""

    def __init__(self, weights: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                 width: int):
        vocab_size = weights.shape[1]
        vals, ids = weights.topk(width, dim=-1)  # [T, C] descending (vals[:, 0] == 1), [T, C] token ids
        rank = torch.arange(width, device=weights.device)  # [C]
        keep = rank.unsqueeze(0) < top_k.unsqueeze(1)  # [T, C] top-k (top_k == vocab_size when off)

        k_fits = top_k <= width  # [T]
        k_off = top_k >= vocab_size  # [T]
        uses_p = top_p < 1  # [T]
        kept = vals * keep  # [T, C]
        # top-p renormalises over what top-k kept: the candidates hold all of it when k fits; with top-k
        # off it is the whole row; for width < k < vocab it is unknown here (such rows stay unresolved).
        total = kept.sum(dim=-1)  # [T]
        if bool((uses_p & k_off).any()):
            total = torch.where(k_off, weights.sum(dim=-1), total)
        probs = kept / total.unsqueeze(1)  # [T, C]
        cum = probs.cumsum(dim=-1)  # [T, C]
        p = top_p.masked_fill(~uses_p, float("inf"))  # [T] so rounding in cum never trims a top_p=1 row
        keep &= (cum - probs) < p.unsqueeze(1)
        keep &= vals >= min_p.unsqueeze(1)  # prob / max prob = weight

        normaliser_known = k_fits | k_off | ~uses_p  # [T]
        settled_by_p = uses_p & (cum[:, -1] >= top_p)  # the nucleus closes inside the candidates
        settled_by_min_p = vals[:, -1] < min_p  # the last candidate already falls below min-p
        self.vals, self.ids, self.keep = vals, ids, keep
        self.resolved = normaliser_known & (k_fits | settled_by_p | settled_by_min_p)  # [T] bool

    def sample(self, rows: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
        """Tokens [S] for resolved rows [S] (indices into T); generators keyed by position in rows."""
        weights = self.vals[rows].masked_fill_(~self.keep[rows], 0.0)  # [S, C]
        pick = exponential_race(weights, generators)  # [S]
        return self.ids[rows].gather(1, pick.unsqueeze(1)).squeeze(1)  # [S]


def apply_top_k(weights: torch.Tensor, top_k: torch.Tensor) -> None:
    """Full-vocabulary top-k, in place. weights [U, V], top_k [U] (V = off). Ties at the k-th stay."""
    vocab_size = weights.shape[1]
    rows = (top_k < vocab_size).nonzero().squeeze(1)  # [R]
    if rows.numel() == 0:
        return
    sub = weights.index_select(0, rows)  # [R, V]
    k = top_k[rows]  # [R]
    kth = sub.topk(int(k.max()), dim=-1).values.gather(1, (k - 1).unsqueeze(1))  # [R, 1]
    weights.index_copy_(0, rows, sub.masked_fill_(sub < kth, 0.0))


def apply_top_p(weights: torch.Tensor, top_p: torch.Tensor) -> None:
    """Full-vocabulary top-p by sorting, in place. weights [U, V], top_p [U] (1 = off)."""
    rows = (top_p < 1).nonzero().squeeze(1)  # [R]
    if rows.numel() == 0:
        return
    sub = weights.index_select(0, rows)  # [R, V]
    sorted_w, order = sub.sort(dim=-1, descending=True)  # [R, V], [R, V]
    probs = sorted_w.div_(sorted_w.sum(dim=-1, keepdim=True))  # [R, V]
    cum = probs.cumsum(dim=-1)  # [R, V]
    drop_sorted = (cum - probs) >= top_p[rows].unsqueeze(1)  # [R, V] mass strictly above >= p
    drop = torch.empty_like(drop_sorted).scatter_(1, order, drop_sorted)  # [R, V] back in token order
    weights.index_copy_(0, rows, sub.masked_fill_(drop, 0.0))


def apply_min_p(weights: torch.Tensor, min_p: torch.Tensor) -> None:
    """Full-vocabulary min-p, in place: weight (= prob / max prob) < min_p is dropped."""
    weights.masked_fill_(weights < min_p.unsqueeze(1), 0.0)


def sample_full(weights: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                min_p: torch.Tensor | None, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Mask over the whole vocabulary, then race over it. weights [U, V] (consumed) -> [U] int64."""
    if top_k is not None:
        apply_top_k(weights, top_k)
    if top_p is not None:
        apply_top_p(weights, top_p)
    if min_p is not None and bool((min_p > 0).any()):
        apply_min_p(weights, min_p)
    return block_race(weights, generators)


def sample_truncated(weights: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                     generators: dict[int, torch.Generator], widths: tuple[int, ...] = CANDIDATE_WIDTHS,
                     buffers: RowBuffers | None = None) -> torch.Tensor:
    """Sample rows that use top-k, top-p or min-p. weights [T, V] (see to_weights_; consumed), top_k [T]
    int64 (V = off), top_p [T] float32 (1 = off), min_p [T] float32 (0 = off) -> [T] int64."""
    num_rows, vocab_size = weights.shape
    buffers = buffers or RowBuffers()
    out = torch.empty(num_rows, dtype=torch.long, device=weights.device)  # [T]
    pending = torch.arange(num_rows, device=weights.device)  # [P] rows not yet sampled
    for width in widths:
        if width >= vocab_size or pending.numel() == 0:
            break
        sub = weights if pending.numel() == num_rows else buffers.rows_of("pending", weights, pending)  # [P, V]
        attempt = CandidateRound(sub, top_k[pending], top_p[pending], min_p[pending], width)
        settled = attempt.resolved.nonzero().squeeze(1)  # [S] positions within pending
        if settled.numel():
            rows = pending[settled]  # [S]
            out[rows] = attempt.sample(settled, subset_generators(generators, rows.tolist()))
            pending = pending[~attempt.resolved]
    if pending.numel():
        sub = weights if pending.numel() == num_rows else buffers.rows_of("pending", weights, pending)  # [P, V]
        out[pending] = sample_full(sub, top_k[pending], top_p[pending], min_p[pending],
                                   subset_generators(generators, pending.tolist()))
    return out
