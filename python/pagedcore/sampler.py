"""`Sampler`: logits of one step's sampling rows -> next token ids (+ logprobs), vectorised over rows.

    logits [R, V] ─▶ raw logprobs? ─▶ logit_bias ─▶ min_tokens bans ─▶ repetition ─▶ presence/frequency
         ├─ greedy rows: argmax
         └─ random rows: temperature ─▶ top-k / top-p / min-p ─▶ exponential race (per-row generators)

Stages no row needs are skipped (SamplingMetadata leaves them None); an all-greedy step is an argmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pagedcore.sampling.logprobs import gather_logprobs
from pagedcore.sampling.metadata import SamplingMetadata
from pagedcore.sampling.noise import exponential_race, subset_generators
from pagedcore.sampling.penalties import (apply_bans, apply_logit_bias, apply_presence_frequency,
                                          apply_repetition_penalty)
from pagedcore.sampling.truncation import CANDIDATE_WIDTHS, sample_truncated


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [R] int64
    # Present when any row asked for logprobs; K = the largest `logprobs` of the step. Column 0 is the
    # sampled token, columns 1..K the top-K of the raw distribution.
    logprob_token_ids: torch.Tensor | None = None  # [R, K + 1] int64
    logprobs: torch.Tensor | None = None  # [R, K + 1] float32
    sampled_token_ranks: torch.Tensor | None = None  # [R] int64, 1-based


class Sampler:
    def __init__(self, candidate_widths: tuple[int, ...] = CANDIDATE_WIDTHS):
        self.candidate_widths = candidate_widths

    def __call__(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        """logits [R, V] float32, edited in place (saves a [R, V] copy per step)."""
        md = metadata
        if logits.dim() != 2 or logits.shape[0] != md.num_rows or logits.shape[1] != md.vocab_size:
            raise ValueError(f"logits have shape {tuple(logits.shape)} but the metadata was built for "
                             f"[{md.num_rows}, {md.vocab_size}]; build it from this step's rows and the "
                             "model's vocabulary size")
        # Before any edit: logprobs describe the model, not the sampling settings.
        raw_logprobs = logits.log_softmax(dim=-1) if md.max_num_logprobs is not None else None  # [R, V]

        if md.logit_bias is not None:
            apply_logit_bias(logits, md.logit_bias)
        if md.banned is not None:
            apply_bans(logits, md.banned)
        if md.repetition is not None:
            apply_repetition_penalty(logits, md.repetition, md.repetition_penalty)
        if md.output_tokens is not None:
            apply_presence_frequency(logits, md.output_tokens, md.presence_penalty, md.frequency_penalty)

        sampled = self._sample(logits, md)  # [R]
        if raw_logprobs is None:
            return SamplerOutput(sampled)
        ids, values, ranks = gather_logprobs(raw_logprobs, sampled, md.max_num_logprobs)
        return SamplerOutput(sampled, ids, values, ranks)

    def _sample(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        if md.all_greedy:
            return logits.argmax(dim=-1)
        if md.random_row_ids is None:
            return self._sample_random(logits, md)
        sampled = torch.empty(md.num_rows, dtype=torch.long, device=logits.device)  # [R]
        # Greedy rows take the argmax after bias and penalties but before temperature, as in vLLM.
        sampled[md.greedy_row_ids] = logits[md.greedy_row_ids].argmax(dim=-1)
        sampled[md.random_row_ids] = self._sample_random(logits[md.random_row_ids], md)
        return sampled

    def _sample_random(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        """logits [M, V] of the random rows (consumed) -> [M] int64."""
        logits.div_(md.temperature.unsqueeze(1))
        if md.top_k is None:
            return _race_full(logits, md.generators)
        if md.truncated_rows is None:
            return sample_truncated(logits, md.top_k, md.top_p, md.min_p, md.generators, self.candidate_widths)
        sampled = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)  # [M]
        rows = md.truncated_rows  # [T]
        sampled[rows] = sample_truncated(logits[rows], md.top_k[rows], md.top_p[rows], md.min_p[rows],
                                         subset_generators(md.generators, rows.tolist()),
                                         self.candidate_widths)
        if md.plain_rows is not None:
            rows = md.plain_rows  # [M - T]
            sampled[rows] = _race_full(logits[rows], subset_generators(md.generators, rows.tolist()))
        return sampled


def _race_full(logits: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Sample from softmax(logits) over the whole vocabulary. logits [U, V] (consumed) -> [U] int64."""
    weights = logits.sub_(logits.amax(dim=-1, keepdim=True)).exp_()  # [U, V] unnormalised probs
    return exponential_race(weights, generators)


def repeat_rows(logits: torch.Tensor, counts: Sequence[int] | int) -> torch.Tensor:
    """Rows for n > 1: logits [R, V] -> [sum(counts), V], row i repeated counts[i] times (the engine
    then builds one SamplingMetadata row per child, e.g. with SamplingParams.child_params)."""
    if isinstance(counts, int):
        return logits.repeat_interleave(counts, dim=0)
    return logits.repeat_interleave(torch.as_tensor(counts, device=logits.device), dim=0)
