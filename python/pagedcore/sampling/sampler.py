"""`Sampler`: logits of one step's sampling rows -> next token ids (+ logprobs), vectorised over rows.

    logits [R, V] ─▶ (copy of the rows that want logprobs) ─▶ logit_bias ─▶ min_tokens bans
        ─▶ repetition penalty ─▶ presence/frequency penalty
        ├─ CPU logits: every row in one C++ call (ops/sample_rows.py): greedy rows' argmax, random
        │  rows' weights, thresholds and the block race (cpp/kernels/sample_rows.h)
        ├─ greedy rows: argmax
        └─ random rows: weights exp((l - max) / T) in place ─▶ top-k / top-p / min-p ─▶ exponential race
                        (per-row generators for seeded rows)

Stages no row needs are skipped (SamplingMetadata leaves them None); an all-greedy step is an argmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pagedcore.ops import sample_rows as cpu_sampler
from pagedcore.ops.argmax import argmax_rows_tensor
from pagedcore.sampling.logprobs import gather_logprobs
from pagedcore.sampling.metadata import SamplingMetadata
from pagedcore.sampling.noise import block_race
from pagedcore.sampling.penalties import apply_edits
from pagedcore.sampling.truncation import CANDIDATE_WIDTHS, sample_truncated, to_weights_
from pagedcore.sampling.workspace import RowBuffers


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [R] int64
    # Present when any row asked for logprobs; K = the largest `logprobs` of the step. Column 0 is the
    # sampled token, columns 1..K the top-K of the raw distribution (log_softmax of the logits as the
    # model gave them). Rows that did not ask hold the sampled id, then 0s, NaN logprobs and rank 0.
    logprob_token_ids: torch.Tensor | None = None  # [R, K + 1] int64
    logprobs: torch.Tensor | None = None  # [R, K + 1] float32
    sampled_token_ranks: torch.Tensor | None = None  # [R] int64, 1-based


class Sampler:
    """Stateless between steps except for reusable buffers; keep one per engine (not thread-safe)."""

    def __init__(self, candidate_widths: tuple[int, ...] = CANDIDATE_WIDTHS):
        self.candidate_widths = candidate_widths
        self.buffers = RowBuffers()

    def __call__(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        """logits [R, V] float32, consumed: edited in place (a [R, V] copy per step saved). Other
        dtypes are widened first (one copy): weights and cumulative sums need float32's range."""
        md = metadata
        if logits.dtype != torch.float32:
            logits = logits.float()
        if logits.dim() != 2 or logits.shape[0] != md.num_rows or logits.shape[1] != md.vocab_size:
            raise ValueError(f"logits have shape {tuple(logits.shape)} but the metadata was built for "
                             f"[{md.num_rows}, {md.vocab_size}]; build it from this step's rows and the "
                             "model's vocabulary size")
        # Before any edit: logprobs describe the model, not the sampling settings.
        raw = None
        if md.max_num_logprobs is not None:
            raw = self.buffers.rows_of("raw", logits, md.logprob_rows)  # [L, V]

        apply_edits(logits, md)
        sampled = self._sample(logits, md)  # [R]
        if raw is None:
            return SamplerOutput(sampled)
        return with_logprobs(sampled, raw, md.max_num_logprobs, md.logprob_rows)

    def _sample(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        if md.all_greedy:
            return argmax_rows_tensor(logits)
        # CPU logits: the C++ kernel; the torch stages below serve other devices (and PAGEDCORE_CPU_SAMPLER=0).
        if md.rows is not None and cpu_sampler.enabled() and cpu_sampler.takes(logits):
            return torch.from_numpy(cpu_sampler.sample_rows(logits, md.rows))
        if md.random_row_ids is None:  # every row random, already in sampling order: work in place
            return self._sample_random(logits, md)
        sampled = torch.empty(md.num_rows, dtype=torch.long, device=logits.device)  # [R]
        # A copy, so the greedy rows below still see the logits (after bias and penalties, before
        # temperature: vLLM's greedy).
        random_rows = self.buffers.rows_of("random", logits, md.random_row_ids)  # [M, V]
        sampled[md.random_row_ids] = self._sample_random(random_rows, md)
        if md.greedy_row_ids is not None:
            sampled[md.greedy_row_ids] = argmax_rows_tensor(self.buffers.rows_of("greedy", logits, md.greedy_row_ids))
        return sampled

    def _sample_random(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        """logits [M, V]: the random rows in sampling order (consumed) -> [M] int64."""
        weights = to_weights_(logits, md.temperature)  # [M, V], same storage
        num_truncated = md.num_truncated
        if num_truncated == 0:
            return block_race(weights, md.generators)
        if num_truncated == weights.shape[0]:
            return sample_truncated(weights, md.top_k, md.top_p, md.min_p, md.generators,
                                    self.candidate_widths, self.buffers)
        head = {pos: g for pos, g in md.generators.items() if pos < num_truncated}
        tail = {pos - num_truncated: g for pos, g in md.generators.items() if pos >= num_truncated}
        return torch.cat([  # both groups are contiguous slices: no copies
            sample_truncated(weights[:num_truncated], md.top_k, md.top_p, md.min_p, head,
                             self.candidate_widths, self.buffers),
            block_race(weights[num_truncated:], tail),
        ])


def with_logprobs(sampled: torch.Tensor, raw: torch.Tensor, max_num_logprobs: int,
                  logprob_rows: torch.Tensor | None) -> SamplerOutput:
    """sampled [R]; raw [L, V]: the untouched logits of the rows that want logprobs (consumed), rows
    logprob_rows [L] (None: all R); the one-call step hands its copies here too (sampling/logprobs.py
    RawLogitRows)."""
    if logprob_rows is None:
        ids, values, ranks = gather_logprobs(raw, sampled, max_num_logprobs)
        return SamplerOutput(sampled, ids, values, ranks)
    rows = logprob_rows  # [L]
    num_rows = sampled.shape[0]
    sub_ids, sub_values, sub_ranks = gather_logprobs(raw, sampled[rows], max_num_logprobs)
    width = max_num_logprobs + 1
    ids = torch.zeros(num_rows, width, dtype=torch.long, device=sampled.device)  # [R, K + 1]
    ids[:, 0] = sampled
    ids[rows] = sub_ids
    values = torch.full((num_rows, width), float("nan"), device=sampled.device)  # [R, K + 1]
    values[rows] = sub_values
    ranks = torch.zeros(num_rows, dtype=torch.long, device=sampled.device)  # [R]
    ranks[rows] = sub_ranks
    return SamplerOutput(sampled, ids, values, ranks)


def repeat_rows(logits: torch.Tensor, counts: Sequence[int] | int) -> torch.Tensor:
    """Rows for n > 1: logits [R, V] -> [sum(counts), V], row i repeated counts[i] times (the engine
    then builds one SamplingMetadata row per child, e.g. with SamplingParams.child_params)."""
    if isinstance(counts, int):
        return logits.repeat_interleave(counts, dim=0)
    return logits.repeat_interleave(torch.as_tensor(counts, device=logits.device), dim=0)
