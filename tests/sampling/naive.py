"""Naive per-row reference of every sampler stage: Python loops over rows and tokens, float64
where probabilities are summed. Slow on purpose; only the tests use it."""

import math
from collections import Counter

import torch

from pagedcore.sampling_params import SamplingParams


def process_row(logits_row: torch.Tensor, params: SamplingParams, prompt_ids, output_ids, eos_ids=()):
    """Bias, min_tokens bans and penalties of one row, in the sampler's order -> a new [V] tensor."""
    row = logits_row.clone()
    for token_id, bias in (params.logit_bias or {}).items():
        row[token_id] += bias
    if len(output_ids) < params.min_tokens:
        banned = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_ids))
        for token_id in banned:
            row[token_id] = float("-inf")
    if params.repetition_penalty != 1:
        for token_id in set(prompt_ids) | set(output_ids):
            value = row[token_id].item()
            row[token_id] = value / params.repetition_penalty if value > 0 else value * params.repetition_penalty
    for token_id, count in Counter(output_ids).items():
        row[token_id] -= params.frequency_penalty * count + params.presence_penalty
    return row


def support(row: torch.Tensor, top_k: int, top_p: float, min_p: float) -> set[int]:
    """Tokens top-k, then top-p (renormalised over top-k), then min-p keep. row [V]: tempered logits."""
    values = row.double().tolist()
    finite = [i for i, v in enumerate(values) if v != float("-inf")]
    order = sorted(finite, key=lambda i: -values[i])
    kept = order[:top_k] if top_k > 0 else order
    peak = values[order[0]]
    weights = {i: math.exp(values[i] - peak) for i in kept}
    total = sum(weights.values())
    nucleus, mass_above = [], 0.0
    for i in kept:  # descending
        if mass_above >= top_p and top_p < 1:
            break
        nucleus.append(i)
        mass_above += weights[i] / total
    # min-p: prob / max prob = exp(logit - max logit), whatever the normalisation
    return {i for i in nucleus if math.exp(values[i] - peak) >= min_p}


def probabilities(row: torch.Tensor, keep: set[int]) -> dict[int, float]:
    values = row.double()
    peak = max(values[i].item() for i in keep)
    weights = {i: math.exp(values[i].item() - peak) for i in keep}
    total = sum(weights.values())
    return {i: w / total for i, w in weights.items()}
