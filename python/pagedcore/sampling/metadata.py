"""`SamplingMetadata`: one step's per-row sampling inputs as tensors, built once per step.

Every stage no row needs is left as None so the sampler skips it without looking at a tensor.
Ragged per-row token lists (penalties, bias, min_tokens bans) become flat (row, token) pairs: a
stage then touches only the N tokens involved, never a dense [rows, vocab] buffer.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pagedcore.sampling.row_sampling import RowSampling
from pagedcore.sampling_params import SamplingParams


@dataclass
class TokenPairs:
    """A sparse selection of a [rows, vocab] tensor: element i is (row_ids[i], token_ids[i])."""

    row_ids: torch.Tensor  # [N] int64
    token_ids: torch.Tensor  # [N] int64
    values: torch.Tensor | None = None  # [N] float32 when each pair carries a value (logit_bias)


@dataclass
class SamplingMetadata:
    num_rows: int
    vocab_size: int
    all_greedy: bool  # the fast path: argmax (after bias/min_tokens/penalties), nothing else
    greedy_row_ids: torch.Tensor | None  # [G] int64 rows with temperature 0; None when there are none

    # The random rows (temperature > 0) are sampled in this order, truncated ones first, so that
    # both groups are contiguous slices of one copy:
    #     random_row_ids: [ rows using top-k/top-p/min-p (num_truncated) | plain rows ]
    # None when the order is simply 0..num_rows-1 (no greedy rows, one group): sampled in place.
    random_row_ids: torch.Tensor | None  # [M] int64
    num_truncated: int
    temperature: torch.Tensor | None  # [M] float32, in sampling order; None when all greedy
    top_k: torch.Tensor | None  # [num_truncated] int64, vocab_size = off; None when no row truncates
    top_p: torch.Tensor | None  # [num_truncated] float32, 1 = off
    min_p: torch.Tensor | None  # [num_truncated] float32, 0 = off
    generators: dict[int, torch.Generator]  # position in sampling order -> the row's own generator
    # The same rows in row order for the C++ sampler (ops/sample_rows.py), which takes CPU logits;
    # the fields above serve the torch stages, which run on any device. None when all greedy.
    rows: RowSampling | None

    logit_bias: TokenPairs | None  # pairs with values = bias
    banned: TokenPairs | None  # EOS and stop ids of rows still short of min_tokens
    repetition: TokenPairs | None  # prompt + output tokens of rows with repetition_penalty != 1
    repetition_penalty: torch.Tensor | None  # [num_rows] float32
    output_tokens: TokenPairs | None  # output tokens of rows with presence or frequency penalty
    presence_penalty: torch.Tensor | None  # [num_rows] float32
    frequency_penalty: torch.Tensor | None  # [num_rows] float32

    max_num_logprobs: int | None  # the largest `logprobs` of any row; None = no row wants logprobs
    logprob_rows: torch.Tensor | None  # [L] int64 rows that want logprobs; None = all (or none) of them

    @classmethod
    def from_requests(
        cls,
        params: Sequence[SamplingParams],
        *,
        vocab_size: int,
        eos_token_ids: Collection[int] = (),
        prompt_token_ids: Sequence[Sequence[int]] | None = None,
        output_token_ids: Sequence[Sequence[int]] | None = None,
        generators: Sequence[torch.Generator | None] | None = None,
        num_output_tokens: Sequence[int] | None = None,
        device: torch.device | str = "cpu",
    ) -> SamplingMetadata:
        """One row per entry of params (a request with n > 1 appears n times).

        prompt_token_ids / output_token_ids are only read for rows with penalties; num_output_tokens
        (default: the lengths of output_token_ids) only for rows with min_tokens; generators[i] must be
        the row's own, persistent generator (see make_generator) when params[i].seed is set.
        """
        num_rows = len(params)
        if num_rows == 0:
            raise ValueError("SamplingMetadata needs at least one row")
        greedy_rows = [i for i, p in enumerate(params) if p.temperature == 0]
        truncated = [i for i, p in enumerate(params) if p.temperature != 0 and p.has_truncation]
        plain = [i for i, p in enumerate(params) if p.temperature != 0 and not p.has_truncation]
        order = truncated + plain  # sampling order of the random rows
        in_place = not greedy_rows and (not truncated or not plain)  # order is 0..num_rows-1

        def tensor(values, dtype):
            return torch.tensor(values, dtype=dtype).to(device)

        ordered = [params[i] for i in order]
        temperature = top_k = top_p = min_p = None
        # Row order for the C++ sampler; it also checks that every seeded random row has its generator.
        rows = RowSampling.from_params(params, generators, vocab_size) if order else None
        row_generators: dict[int, torch.Generator] = {}
        if order:
            temperature = tensor([p.temperature for p in ordered], torch.float32)
            if truncated:
                head = ordered[:len(truncated)]
                top_k = tensor([p.top_k if p.top_k > 0 else vocab_size for p in head], torch.long)
                top_p = tensor([p.top_p for p in head], torch.float32)
                min_p = tensor([p.min_p for p in head], torch.float32)
            row_generators = {position: rows.generators[row] for position, row in enumerate(order)
                              if row in rows.generators}

        logit_bias = _logit_bias_pairs(params, vocab_size, device)
        banned = _min_tokens_bans(params, eos_token_ids, output_token_ids, num_output_tokens, vocab_size, device)

        repetition = repetition_penalty = output_tokens = presence = frequency = None
        rep_rows = [i for i, p in enumerate(params) if p.repetition_penalty != 1]
        if rep_rows:
            if prompt_token_ids is None or output_token_ids is None:
                raise ValueError("repetition_penalty needs prompt_token_ids and output_token_ids")
            seqs = [prompt_token_ids[i] for i in rep_rows] + [output_token_ids[i] for i in rep_rows]
            repetition = _pairs(rep_rows + rep_rows, seqs, device)
            repetition_penalty = tensor([p.repetition_penalty for p in params], torch.float32)
        po_rows = [i for i, p in enumerate(params) if p.presence_penalty != 0 or p.frequency_penalty != 0]
        if po_rows:
            if output_token_ids is None:
                raise ValueError("presence_penalty / frequency_penalty need output_token_ids")
            output_tokens = _pairs(po_rows, [output_token_ids[i] for i in po_rows], device)
            presence = tensor([p.presence_penalty for p in params], torch.float32)
            frequency = tensor([p.frequency_penalty for p in params], torch.float32)

        logprob_rows = [i for i, p in enumerate(params) if p.logprobs is not None]
        wanted = [params[i].logprobs for i in logprob_rows]
        return cls(
            num_rows=num_rows,
            vocab_size=vocab_size,
            all_greedy=not order,
            greedy_row_ids=tensor(greedy_rows, torch.long) if greedy_rows and order else None,
            random_row_ids=None if in_place or not order else tensor(order, torch.long),
            num_truncated=len(truncated),
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            generators=row_generators,
            rows=rows,
            logit_bias=logit_bias,
            banned=banned,
            repetition=repetition,
            repetition_penalty=repetition_penalty,
            output_tokens=output_tokens,
            presence_penalty=presence,
            frequency_penalty=frequency,
            max_num_logprobs=max(wanted) if wanted else None,
            logprob_rows=tensor(logprob_rows, torch.long) if 0 < len(logprob_rows) < num_rows else None,
        )


def make_generator(params: SamplingParams, device: torch.device | str = "cpu") -> torch.Generator | None:
    """The request's own generator (None when unseeded). Create once per request (per child for n > 1)
    and pass the same object every step: its state is what makes the next draw reproducible."""
    if params.seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(params.seed)
    return generator


def _flatten(seqs: Sequence[Sequence[int]]) -> torch.Tensor:
    """Concatenate ragged int sequences (lists, numpy arrays or tensors) -> [N] int64."""
    if seqs and isinstance(seqs[0], torch.Tensor):
        return torch.cat([s.reshape(-1).to(torch.long) for s in seqs])
    if seqs and isinstance(seqs[0], np.ndarray):
        return torch.from_numpy(np.concatenate(seqs).astype(np.int64, copy=False))
    return torch.tensor(list(itertools.chain.from_iterable(seqs)), dtype=torch.long)


def _pairs(rows: list[int], seqs: Sequence[Sequence[int]], device) -> TokenPairs:
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)  # [len(rows)]
    row_ids = torch.repeat_interleave(torch.tensor(rows, dtype=torch.long), lengths)  # [N]
    return TokenPairs(row_ids.to(device), _flatten(seqs).to(device))


def _check_token(token_id: int, vocab_size: int, what: str):
    if not 0 <= token_id < vocab_size:
        raise ValueError(f"{what} holds token id {token_id}, outside the vocabulary [0, {vocab_size})")


def logit_bias_lists(params, vocab_size) -> tuple[list[int], list[int], list[float]]:
    """(rows, token ids, biases) of every row's logit_bias (checked against the vocabulary): the
    Sampler's pairs (_logit_bias_pairs) and the one-call step's (logit_edits.py)."""
    rows, tokens, values = [], [], []
    for i, p in enumerate(params):
        if p.logit_bias:
            for token_id, bias in p.logit_bias.items():
                _check_token(token_id, vocab_size, "logit_bias")
                rows.append(i)
                tokens.append(token_id)
                values.append(bias)
    return rows, tokens, values


def min_tokens_ban_lists(params, eos_token_ids, output_token_ids, num_output_tokens, vocab_size
                         ) -> tuple[list[int], list[int]]:
    """(rows, token ids) held back this step: the EOS and stop ids of rows still short of min_tokens
    (checked against the vocabulary). Shared as logit_bias_lists is."""
    rows, tokens = [], []
    for i, p in enumerate(params):
        if p.min_tokens == 0:
            continue
        if num_output_tokens is not None:
            num_done = num_output_tokens[i]
        elif output_token_ids is not None:
            num_done = len(output_token_ids[i])
        else:
            raise ValueError("min_tokens needs num_output_tokens (or output_token_ids)")
        if num_done >= p.min_tokens:
            continue
        # ignore_eos: EOS is not a stop token for this row, so there is nothing to hold back.
        stop_ids = set(p.stop_token_ids) if p.ignore_eos else set(p.stop_token_ids) | set(eos_token_ids)
        for token_id in stop_ids:
            _check_token(token_id, vocab_size, "stop_token_ids / eos_token_ids")
            rows.append(i)
            tokens.append(token_id)
    return rows, tokens


def _logit_bias_pairs(params, vocab_size, device) -> TokenPairs | None:
    rows, tokens, values = logit_bias_lists(params, vocab_size)
    if not rows:
        return None
    return TokenPairs(torch.tensor(rows, device=device), torch.tensor(tokens, device=device),
                      torch.tensor(values, dtype=torch.float32, device=device))


def _min_tokens_bans(params, eos_token_ids, output_token_ids, num_output_tokens, vocab_size, device):
    rows, tokens = min_tokens_ban_lists(params, eos_token_ids, output_token_ids, num_output_tokens, vocab_size)
    if not rows:
        return None
    return TokenPairs(torch.tensor(rows, device=device), torch.tensor(tokens, device=device))
