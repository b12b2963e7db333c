"""The engine's side of the plain step in one C++ call (models/greedy_decode.py): which steps qualify
and what the call gets (each row's sampling inputs, logit edits and logprob rows)."""

from __future__ import annotations

import numpy as np
import torch

from pagedcore.engine.output_processor import has_logit_edits
from pagedcore.ops import sample_rows as cpu_sampler
from pagedcore.sampling.logit_edits import LogitEdits
from pagedcore.sampling.logit_edits import enabled as logit_edits_enabled
from pagedcore.sampling.logprobs import RawLogitRows
from pagedcore.sampling.row_sampling import RowSampling
from pagedcore.sampling.sampler import SamplerOutput, with_logprobs


def plain_rows(engine, rows) -> bool:
    """Nothing but each sampled row's token (and its logprobs) is wanted from this step's logits: no
    drafts to verify, no beams, no grammar masks, no first samples to fork (n > 1); every row greedy
    or sampled by temperature / top-k / top-p / min-p, after its penalties, logit bias and min_tokens
    bans (the one-call step applies those too: sampling/logit_edits.py)."""
    return (engine.speculator is None and len(engine.beam_search) == 0 and not engine.registry.num_constrained
            and not any(s.request.needs_fork for s in rows))


def rows_edits(rows, vocab_size: int, eos_token_ids) -> LogitEdits | None:
    """The logit edits of the sequences `rows` as a step over them makes them now (None: no edit)."""
    return LogitEdits.from_requests(
        [s.params for s in rows], vocab_size=vocab_size, eos_token_ids=eos_token_ids,
        prompt_token_ids=[s.request.prompt_token_ids for s in rows],
        output_token_ids=[s.output_token_ids for s in rows],
        num_output_tokens=[len(s.output_token_ids) for s in rows])


def fused_step(engine, step_input, rows) -> tuple[np.ndarray, SamplerOutput | None] | None:
    """(the step's tokens, their logprobs or None) from one C++ call when its rows are plain, or None
    (nothing run, no noise drawn) for the Python forward and sampler."""
    if not plain_rows(engine, rows):
        return None
    sampled = not all(s.params.temperature == 0 for s in rows)
    if sampled and not cpu_sampler.enabled():
        return None
    edited = any(has_logit_edits(s.params) for s in rows)
    if edited and not logit_edits_enabled():
        return None
    op = engine.output_processor
    vocab_size = op.vocab_size
    sampling = RowSampling.from_params([s.params for s in rows], [s.generator for s in rows],
                                       vocab_size) if sampled else None
    edits = rows_edits(rows, vocab_size, op.eos_token_ids) if edited else None
    wanted = [i for i, s in enumerate(rows) if s.params.logprobs is not None]
    raw = RawLogitRows.of(wanted, vocab_size) if wanted else None
    tokens = engine.worker.execute_fused_step(step_input, sampling, edits, raw)
    if tokens is None or raw is None:
        return None if tokens is None else (tokens, None)
    # Logprobs of the raw rows, as the Sampler computes them on its own copy.
    return tokens, with_logprobs(torch.from_numpy(tokens), raw.out, max(rows[i].params.logprobs for i in wanted),
                                 None if len(wanted) == len(rows) else torch.from_numpy(raw.rows))
