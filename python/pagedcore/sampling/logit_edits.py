"""`LogitEdits`: one step's logit_bias, min_tokens bans and repetition / presence / frequency penalties
as the flat numpy arrays the C++ edits take (cpp/kernels/logit_edits.h), for a step the engine runs as
one C++ call (models/greedy_decode.py).

Built from the same lists the Sampler's torch stages get their pairs from (sampling/metadata.py's
logit_bias_lists and min_tokens_ban_lists; the prompt and output tokens of penalised rows), in numpy
(from_requests: 66 us a step for a penalised row where a SamplingMetadata's torch tensors took 195 us,
Zen 4). Both paths edit the same logits the same way (tests/kernels/test_logit_edits.py). Two changes
of form, not of result: a token listed several times for a row is one pair (repetition: each copy wrote
the same value; presence / frequency: the pair carries its number of occurrences, and the kernel adds
-frequency that many times, one at a time, as torch's serial index_put_(accumulate=True) does).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pagedcore import _core
from pagedcore.sampling.metadata import logit_bias_lists, min_tokens_ban_lists
from pagedcore.sampling_params import SamplingParams

_EMPTY_INT = np.zeros(0, dtype=np.int32)


def enabled() -> bool:
    """PAGEDCORE_FUSED_LOGIT_EDITS=0: steps with such rows take the Python forward and sampler (A/B runs)."""
    return os.environ.get("PAGEDCORE_FUSED_LOGIT_EDITS", "1") != "0"


@dataclass
class LogitEdits:
    bias_rows: np.ndarray  # [B] int32: logit_bias pairs (one per row and token) ...
    bias_tokens: np.ndarray  # [B] int32
    bias_values: np.ndarray  # [B] float32: ... and their bias
    ban_rows: np.ndarray  # [N] int32: min_tokens bans (EOS and stop ids of rows still short)
    ban_tokens: np.ndarray  # [N] int32
    repetition_rows: np.ndarray  # [P] int32: distinct prompt + output tokens of rows with a repetition penalty
    repetition_tokens: np.ndarray  # [P] int32
    counted_rows: np.ndarray  # [C] int32: distinct output tokens of rows with a presence / frequency penalty ...
    counted_tokens: np.ndarray  # [C] int32
    counts: np.ndarray  # [C] int32: ... and how often each occurs (>= 1)
    repetition_penalty: np.ndarray  # [R] float32 (1 = off)
    presence_penalty: np.ndarray  # [R] float32 (0 = off)
    frequency_penalty: np.ndarray  # [R] float32 (0 = off)

    @classmethod
    def from_requests(cls, params: Sequence[SamplingParams], *, vocab_size: int, eos_token_ids: Collection[int],
                      prompt_token_ids: Sequence[Sequence[int]], output_token_ids: Sequence[Sequence[int]],
                      num_output_tokens: Sequence[int]) -> LogitEdits | None:
        """One row per entry of params, as SamplingMetadata.from_requests takes them; None when no
        row has an edit."""
        bias_rows, bias_tokens, bias_values = logit_bias_lists(params, vocab_size)
        ban_rows, ban_tokens = min_tokens_ban_lists(params, eos_token_ids, output_token_ids, num_output_tokens,
                                                    vocab_size)
        rep_rows = [i for i, p in enumerate(params) if p.repetition_penalty != 1]
        counted = [i for i, p in enumerate(params) if p.presence_penalty != 0 or p.frequency_penalty != 0]
        if not (bias_rows or ban_rows or rep_rows or counted):
            return None
        repetition = [(i, _distinct_tokens(prompt_token_ids[i], output_token_ids[i], vocab_size)[0])
                      for i in rep_rows]
        counts = [(i, *_distinct_tokens(output_token_ids[i], (), vocab_size)) for i in counted]
        return cls(
            bias_rows=np.array(bias_rows, dtype=np.int32), bias_tokens=np.array(bias_tokens, dtype=np.int32),
            bias_values=np.array(bias_values, dtype=np.float32), ban_rows=np.array(ban_rows, dtype=np.int32),
            ban_tokens=np.array(ban_tokens, dtype=np.int32),
            repetition_rows=_rows_of(repetition), repetition_tokens=_concat(t for _, t in repetition),
            counted_rows=_rows_of(counts), counted_tokens=_concat(t for _, t, _ in counts),
            counts=_concat(c for _, _, c in counts),
            repetition_penalty=np.array([p.repetition_penalty for p in params], dtype=np.float32),
            presence_penalty=np.array([p.presence_penalty for p in params], dtype=np.float32),
            frequency_penalty=np.array([p.frequency_penalty for p in params], dtype=np.float32))

    def apply(self, logits: torch.Tensor) -> None:
        """Edits logits [R, V] (float32, contiguous, CPU) in place: what the one-call step does to its rows."""
        if logits.dtype != torch.float32 or logits.dim() != 2 or not logits.is_contiguous() or not logits.is_cpu:
            raise ValueError(f"LogitEdits.apply: logits must be a contiguous [rows, vocab] float32 CPU tensor, got "
                             f"{tuple(logits.shape)} {logits.dtype} on {logits.device}")
        _core.apply_logit_edits(logits.numpy(), self)


def _distinct_tokens(first: Sequence[int], second: Sequence[int], vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct token ids of two sequences and how often each occurs: int32 [D] each."""
    tokens = np.concatenate([np.asarray(first, dtype=np.int64).reshape(-1),
                             np.asarray(second, dtype=np.int64).reshape(-1)])
    if len(tokens) and (tokens.min() < 0 or tokens.max() >= vocab_size):
        bad = int(tokens.min()) if tokens.min() < 0 else int(tokens.max())
        raise ValueError(f"a penalised token id {bad} is outside the vocabulary [0, {vocab_size})")
    distinct, counts = np.unique(tokens, return_counts=True)
    return distinct.astype(np.int32), counts.astype(np.int32)


def _rows_of(per_row: list) -> np.ndarray:
    """Each entry's row repeated once per distinct token: int32 [sum of lengths]."""
    if not per_row:
        return _EMPTY_INT
    return np.repeat(np.array([entry[0] for entry in per_row], dtype=np.int32),
                     [len(entry[1]) for entry in per_row]).astype(np.int32)


def _concat(arrays) -> np.ndarray:
    arrays = list(arrays)
    return np.concatenate(arrays).astype(np.int32) if arrays else _EMPTY_INT
