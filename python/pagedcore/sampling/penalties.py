"""Logit edits before any sampling: logit_bias, min_tokens bans, repetition / presence / frequency
penalties. All work on the (row, token) pairs involved, so their cost is the number of tokens in play,
not rows x vocab. Each edits logits [num_rows, vocab] in place.
"""

from __future__ import annotations

import torch

from pagedcore.sampling.metadata import SamplingMetadata, TokenPairs


def apply_edits(logits: torch.Tensor, md: SamplingMetadata) -> None:
    """Every stage md's rows need, in the Sampler's order: logit_bias, min_tokens bans, repetition
    penalty, presence / frequency penalties (the one-call step applies the same, in C++:
    sampling/logit_edits.py)."""
    if md.logit_bias is not None:
        apply_logit_bias(logits, md.logit_bias)
    if md.banned is not None:
        apply_bans(logits, md.banned)
    if md.repetition is not None:
        apply_repetition_penalty(logits, md.repetition, md.repetition_penalty)
    if md.output_tokens is not None:
        apply_presence_frequency(logits, md.output_tokens, md.presence_penalty, md.frequency_penalty)


def apply_logit_bias(logits: torch.Tensor, bias: TokenPairs) -> None:
    # A row's bias dict has unique keys, so accumulate only ever adds one value per element.
    logits.index_put_((bias.row_ids, bias.token_ids), bias.values, accumulate=True)


def apply_bans(logits: torch.Tensor, banned: TokenPairs) -> None:
    logits[banned.row_ids, banned.token_ids] = float("-inf")


def apply_repetition_penalty(logits: torch.Tensor, seen: TokenPairs, penalty: torch.Tensor) -> None:
    """HF semantics: a token seen in the prompt or output has its logit divided by the penalty when
    positive, multiplied when negative. penalty [num_rows]. A token seen twice is listed twice; both
    copies compute the same value from the same gathered logit, so writing both is harmless."""
    index = (seen.row_ids, seen.token_ids)
    vals = logits[index]  # [N]
    p = penalty[seen.row_ids]  # [N]
    logits[index] = torch.where(vals > 0, vals / p, vals * p)


def apply_presence_frequency(logits: torch.Tensor, output_tokens: TokenPairs, presence: torch.Tensor,
                             frequency: torch.Tensor) -> None:
    """OpenAI semantics over generated tokens: logit -= presence * [count > 0] + frequency * count.
    presence, frequency [num_rows]."""
    index = (output_tokens.row_ids, output_tokens.token_ids)
    # Presence once per distinct token: duplicates write the same value, as above.
    logits[index] = logits[index] - presence[output_tokens.row_ids]
    # Frequency once per occurrence: accumulate sums the duplicates into count * frequency.
    logits.index_put_(index, -frequency[output_tokens.row_ids], accumulate=True)
