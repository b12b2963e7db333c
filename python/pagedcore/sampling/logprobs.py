"""Logprobs of sampled and prompt positions, from the model's raw distribution (log_softmax of the
logits before bias, penalties, temperature or truncation: vLLM's default), and their conversion into
the per-position {token_id: Logprob} dicts of the outputs.

Layout, as vLLM's: column 0 is the token that was sampled (or, for prompts, the actual next token),
columns 1..k the top-k tokens, most likely first.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pagedcore import _core
from pagedcore.outputs import Logprob, PromptLogprobs


@dataclass
class RawLogitRows:
    """Rows of a step's logits wanted as the model gave them, for their logprobs: the one-call step
    (models/greedy_decode.py) copies them into `out` before any edit, and the engine then runs
    gather_logprobs on them as the Sampler does on its own copy (the same values, bit for bit)."""

    rows: np.ndarray  # [L] int64: rows of the step's sampled rows
    out: torch.Tensor  # [L, V] float32, filled by the call

    @classmethod
    def of(cls, rows: Sequence[int], vocab_size: int) -> RawLogitRows:
        """The rows that want logprobs -> them and an empty output."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        return cls(rows, torch.empty(len(rows), vocab_size, dtype=torch.float32))


def cpu_enabled() -> bool:
    """PAGEDCORE_CPU_LOGPROBS=0: CPU logits take the torch ops too (A/B runs)."""
    return os.environ.get("PAGEDCORE_CPU_LOGPROBS", "1") != "0"


def gather_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, num_top: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw logits [R, V] float32 (a private copy: consumed in place), token_ids [R] int64 ->
    ids [R, num_top + 1] int64, logprobs [R, num_top + 1] float32, ranks [R] int64 (1-based; a
    token's rank counts every token at least as likely, itself included; top-k ties by the lower id).

    CPU logits: one C++ call (cpp/kernels/logprobs_rows.h: 75-82 us a 49,152-wide row against 220 us
    for the torch ops below, Zen 4; those serve other devices). Either works on the logits rather than a
    log_softmax: ranks and top-k are the same on either, and the normaliser then costs one in-place pass."""
    if (logits.is_cpu and logits.dtype == torch.float32 and logits.dim() == 2 and logits.stride(1) == 1
            and cpu_enabled() and logits.shape[0] > 0):
        num_rows, vocab = logits.shape
        if not 0 <= num_top <= vocab:
            raise ValueError(f"gather_logprobs: {num_top} top logprobs of a {vocab}-token vocabulary")
        token_ids = token_ids.to(torch.long).contiguous()  # [R]
        if token_ids.shape != (num_rows,):
            raise ValueError(f"gather_logprobs: {tuple(token_ids.shape)} token ids for {num_rows} rows")
        ids = torch.empty(num_rows, num_top + 1, dtype=torch.long)  # [R, K + 1]
        values = torch.empty(num_rows, num_top + 1, dtype=torch.float32)  # [R, K + 1]
        ranks = torch.empty(num_rows, dtype=torch.long)  # [R]
        _core.logprobs_rows_cpu(logits.data_ptr(), num_rows, vocab, logits.stride(0), token_ids.data_ptr(), num_top,
                                ids.data_ptr(), values.data_ptr(), ranks.data_ptr())
        return ids, values, ranks
    chosen = logits.gather(1, token_ids.unsqueeze(1))  # [R, 1]
    ranks = torch.count_nonzero(logits >= chosen, dim=-1)  # [R]
    if num_top:
        top_vals, top_ids = logits.topk(num_top, dim=-1)  # [R, num_top]
        ids, values = torch.cat([token_ids.unsqueeze(1), top_ids], 1), torch.cat([chosen, top_vals], 1)
    else:
        ids, values = token_ids.unsqueeze(1), chosen
    peak = logits.amax(dim=-1, keepdim=True)  # [R, 1]
    log_normaliser = logits.sub_(peak).exp_().sum(dim=-1, keepdim=True).log_().add_(peak)  # [R, 1]
    return ids, values - log_normaliser, ranks


def logprob_dicts(ids: torch.Tensor, values: torch.Tensor, ranks: torch.Tensor,
                  num_logprobs: Sequence[int | None],
                  decode: Callable[[int], str] | None = None) -> list[dict[int, Logprob] | None]:
    """One {token_id: Logprob} per row (None for rows that asked for none): the chosen token first,
    then that row's own top-N (N = num_logprobs[row] <= the tensors' top width). One .tolist() per
    tensor: this runs every step."""
    ids_rows, value_rows, rank_rows = ids.tolist(), values.tolist(), ranks.tolist()
    out: list[dict[int, Logprob] | None] = []
    for row, n in enumerate(num_logprobs):
        if n is None:
            out.append(None)
            continue
        row_ids, row_values = ids_rows[row], value_rows[row]
        entry = {row_ids[0]: Logprob(row_values[0], rank_rows[row], decode(row_ids[0]) if decode else None)}
        for rank, (token_id, value) in enumerate(zip(row_ids[1:n + 1], row_values[1:n + 1]), start=1):
            if token_id not in entry:
                entry[token_id] = Logprob(value, rank, decode(token_id) if decode else None)
        out.append(entry)
    return out


def prompt_logprobs(logits: torch.Tensor, prompt_token_ids: Sequence[int], num_logprobs: int,
                    decode: Callable[[int], str] | None = None) -> PromptLogprobs:
    """Per prompt position, the logprob of the actual token there plus the top num_logprobs.

    logits [P, V] (or [P - 1, V]): row i is the model's output at prompt position i, which predicts
    token i + 1; a row for the last position (it predicts the first generated token) is ignored.
    Returns P entries, the first None.
    """
    num_prompt = len(prompt_token_ids)
    if logits.shape[0] not in (num_prompt, num_prompt - 1):
        raise ValueError(f"prompt_logprobs needs {num_prompt} or {num_prompt - 1} logit rows for a "
                         f"{num_prompt}-token prompt, got {logits.shape[0]}")
    if num_prompt < 2:
        return [None] * num_prompt
    raw = logits[: num_prompt - 1].to(torch.float32, copy=True)  # [P - 1, V], consumed below
    targets = torch.as_tensor(list(prompt_token_ids[1:]), dtype=torch.long, device=logits.device)  # [P - 1]
    ids, values, ranks = gather_logprobs(raw, targets, num_logprobs)
    return [None] + logprob_dicts(ids, values, ranks, [num_logprobs] * (num_prompt - 1), decode)
