"""Top-k, top-p and min-p, and the random draw for rows that use them.

Semantics (vLLM's): top-k keeps the k largest logits; top-p then keeps the smallest set of most likely
tokens whose probability, renormalised over what top-k kept, reaches top_p (a token stays while the
mass strictly above it is < top_p); min-p keeps tokens with prob >= min_p * max prob (a ratio, so it
does not care about renormalisation or order).

Speed: a full sort of [rows, 49152] costs ~2 ms a row on CPU, and the exponential noise for a full
row costs as much as the softmax, so truncated rows first try a short list of candidates:
topk(width) of the row. A row whose kept set provably lies inside its candidates ("resolved") is
sampled there, drawing only `width` noise values; the rest retry at a wider width, and the few left
go through full-vocabulary masks (sort included). Which path a row takes depends only on its own
logits and params, so a seeded row is still reproducible whatever shares its batch.
"""

from __future__ import annotations

import torch

from pagedcore.sampling.noise import exponential_race, subset_generators

NEG_INF = float("-inf")
# Candidate widths tried in turn. 64 covers top-k up to 64 and confident nuclei; 1024 nearly every
# top-p <= 0.95 nucleus of a real LM; the rest are sorted.
CANDIDATE_WIDTHS = (64, 1024)


class CandidateRound:
    """One try at width C over rows [T]: the candidates and which rows they settle."""

    def __init__(self, logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                 width: int):
        vocab_size = logits.shape[1]
        vals, ids = logits.topk(width, dim=-1)  # [T, C] descending, [T, C] token ids
        rank = torch.arange(width, device=logits.device)  # [C]
        keep = rank.unsqueeze(0) < top_k.unsqueeze(1)  # [T, C] top-k (top_k == vocab_size when off)

        k_fits = top_k <= width  # [T]
        k_off = top_k >= vocab_size  # [T]
        uses_p = top_p < 1  # [T]
        # top-p renormalises over what top-k kept: the candidates hold all of it when k fits; with
        # top-k off it is the whole row; for width < k < vocab we cannot know it here.
        lse = torch.logsumexp(vals.masked_fill(~keep, NEG_INF), dim=-1)  # [T]
        need_row_lse = uses_p & k_off  # [T]
        if bool(need_row_lse.any()):
            rows = need_row_lse.nonzero().squeeze(1)  # [R]
            lse[rows] = torch.logsumexp(logits[rows], dim=-1)
        probs = torch.exp(vals - lse.unsqueeze(1)).masked_fill_(~keep, 0.0)  # [T, C]
        cum = probs.cumsum(dim=-1)  # [T, C]
        p = top_p.masked_fill(~uses_p, float("inf"))  # [T] so rounding in cum never trims a top_p=1 row
        keep &= (cum - probs) < p.unsqueeze(1)
        floor = vals[:, :1] + torch.log(min_p).unsqueeze(1)  # [T, 1]; log(0) = -inf keeps everything
        keep &= vals >= floor

        normaliser_known = k_fits | k_off | ~uses_p  # [T]
        settled_by_k = k_fits
        settled_by_p = uses_p & (cum[:, -1] >= top_p)  # the nucleus closes inside the candidates
        settled_by_min_p = vals[:, -1] < floor[:, 0]  # the last candidate already falls below min-p
        self.vals, self.ids, self.keep = vals, ids, keep
        self.resolved = normaliser_known & (settled_by_k | settled_by_p | settled_by_min_p)  # [T] bool

    def sample(self, rows: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
        """Tokens [len(rows)] for resolved rows (indices into T); generators keyed by position in rows."""
        vals = self.vals[rows]  # [S, C]
        weights = torch.exp(vals - vals[:, :1]).masked_fill_(~self.keep[rows], 0.0)  # [S, C] unnormalised
        pick = exponential_race(weights, generators)  # [S]
        return self.ids[rows].gather(1, pick.unsqueeze(1)).squeeze(1)  # [S]


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor) -> None:
    """Full-vocabulary top-k, in place. logits [U, V], top_k [U] (V = off). Ties at the k-th value stay."""
    vocab_size = logits.shape[1]
    rows = (top_k < vocab_size).nonzero().squeeze(1)  # [R]
    if rows.numel() == 0:
        return
    sub = logits[rows]  # [R, V]
    k = top_k[rows]  # [R]
    kth = sub.topk(int(k.max()), dim=-1).values.gather(1, (k - 1).unsqueeze(1))  # [R, 1]
    logits[rows] = sub.masked_fill_(sub < kth, NEG_INF)


def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> None:
    """Full-vocabulary top-p by sorting, in place. logits [U, V], top_p [U] (1 = off)."""
    rows = (top_p < 1).nonzero().squeeze(1)  # [R]
    if rows.numel() == 0:
        return
    sub = logits[rows]  # [R, V]
    sorted_vals, order = sub.sort(dim=-1, descending=True)  # [R, V], [R, V]
    probs = sorted_vals.softmax(dim=-1)  # [R, V]
    cum = probs.cumsum(dim=-1)  # [R, V]
    drop_sorted = (cum - probs) >= top_p[rows].unsqueeze(1)  # [R, V] mass strictly above >= p
    drop = torch.empty_like(drop_sorted).scatter_(1, order, drop_sorted)  # [R, V] back to token order
    logits[rows] = sub.masked_fill_(drop, NEG_INF)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> None:
    """Full-vocabulary min-p, in place, in logit space: logit < max + log(min_p) is dropped."""
    rows = (min_p > 0).nonzero().squeeze(1)  # [R]
    if rows.numel() == 0:
        return
    sub = logits[rows]  # [R, V]
    floor = sub.amax(dim=-1, keepdim=True) + torch.log(min_p[rows]).unsqueeze(1)  # [R, 1]
    logits[rows] = sub.masked_fill_(sub < floor, NEG_INF)


def sample_full(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                min_p: torch.Tensor | None, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Mask over the whole vocabulary, then race over it. logits [U, V] (consumed) -> [U] int64."""
    if top_k is not None:
        apply_top_k(logits, top_k)
    if top_p is not None:
        apply_top_p(logits, top_p)
    if min_p is not None:
        apply_min_p(logits, min_p)
    weights = logits.sub_(logits.amax(dim=-1, keepdim=True)).exp_()  # [U, V] unnormalised probs
    return exponential_race(weights, generators)


def sample_truncated(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                     generators: dict[int, torch.Generator],
                     widths: tuple[int, ...] = CANDIDATE_WIDTHS) -> torch.Tensor:
    """Sample rows that use top-k, top-p or min-p. logits [T, V] (tempered; consumed), top_k [T]
    int64 (V = off), top_p [T] float32 (1 = off), min_p [T] float32 (0 = off) -> [T] int64."""
    num_rows, vocab_size = logits.shape
    out = torch.empty(num_rows, dtype=torch.long, device=logits.device)  # [T]
    pending = torch.arange(num_rows, device=logits.device)  # [P] rows not yet sampled
    for width in widths:
        if width >= vocab_size or pending.numel() == 0:
            break
        whole = pending.numel() == num_rows
        sub = logits if whole else logits[pending]  # [P, V]
        attempt = CandidateRound(sub, top_k[pending], top_p[pending], min_p[pending], width)
        settled = attempt.resolved.nonzero().squeeze(1)  # [S] positions within pending
        if settled.numel():
            rows = pending[settled]  # [S]
            out[rows] = attempt.sample(settled, subset_generators(generators, rows.tolist()))
            pending = pending[~attempt.resolved]
    if pending.numel():
        rows_list = pending.tolist()
        out[pending] = sample_full(logits[pending], top_k[pending], top_p[pending], min_p[pending],
                                   subset_generators(generators, rows_list))
    return out
