"""MultiStep: vLLM's num_scheduler_steps for plain decodes (greedy, or sampled by temperature / top-k /
top-p / min-p; with penalties, logit bias and min_tokens or without): up to N tokens a sequence in one
scheduler step and one C++ call, so the Python around a step (schedule, update, outputs: ~0.3-0.6 ms on a
2-core CPU, a tenth of a small model's token) is paid once per N tokens.

It rides on the scheduler's draft slots (the machinery of speculative decoding):

    after a step      every running sequence is a plain decode: each gets k = min(N - 1, tokens it
                      may still produce - 1) placeholder drafts (its last token repeated), append_tokens(draft=True)
    schedule()        allocates their KV slots and schedules 1 + k tokens a sequence: [a, d1 .. dk]
    the step          one C++ call (GreedyDecode.run_steps): step i gives each sequence the token step
                      i - 1 chose, at position and slot i; the placeholders are never read
    update            set_draft_tokens() names the chosen t1 .. tk as the drafts, so update_accepted() keeps
                      all 1 + k tokens with their KV; a stop (EOS, stop id, max_tokens) cuts the rest as for
                      verified drafts, and a stop string ends the request in output processing

Each of those steps is the decode step a single step would run (same kernels, rows and order), so the
tokens are the single steps' bit for bit (tests/engine/test_multi_step.py). A sampled row's noise for
step i is drawn as single step i would draw it (RowSampling.draw_step_noise): seeded requests give the
single steps' tokens always; unseeded ones (torch's global generator) too, unless a sequence stops
(EOS, a stop id) before its last step of a multi-step: then the later global draws shift (a different
but equally distributed sample, as any change of batch gives). Penalties, logit bias and min_tokens bans
are the first step's edits (sampling/logit_edits.py), advanced in C++ by each step's chosen tokens
(cpp/kernels/multi_step_edits.h): each step edits its logits as that single step would.

Before schedule(), the placeholders are removed when the step could not be one call: a request waiting or
swapped out, too few free blocks for every slot (no preemption mid-step), or the worker without the path.
If a step still holds drafts the call does not take (the scheduler did something else), its logits rows
are verified as drafts: each sequence keeps its first row's token (argmax, or sampled as a single step
samples it).
"""

from __future__ import annotations

import numpy as np
import torch

from pagedcore import _core
from pagedcore.engine.fused_step import rows_edits
from pagedcore.engine.output_processor import has_logit_edits
from pagedcore.ops import sample_rows as cpu_sampler
from pagedcore.ops.argmax import argmax_rows
from pagedcore.sampling.logit_edits import LogitEdits
from pagedcore.sampling.logit_edits import enabled as logit_edits_enabled
from pagedcore.sampling.row_sampling import RowSampling
from pagedcore.sampling.sampler import SamplerOutput, with_logprobs


def eligible(seq) -> bool:
    """A sequence whose steps need nothing but each token (and its logprobs), greedy or sampled by the C++
    sampler (temperature, top-k, top-p, min-p), after its penalties, logit bias and min_tokens bans in C++:
    no grammar or forks."""
    p = seq.params
    return ((p.temperature == 0 or cpu_sampler.enabled()) and (not has_logit_edits(p) or logit_edits_enabled())
            and seq.grammar is None and not seq.request.needs_fork and not seq.finished)


def row_sampling(rows, vocab_size: int) -> RowSampling | None:
    """The rows' sampling inputs (a row a sequence), or None when every row is greedy."""
    if all(s.params.temperature == 0 for s in rows):
        return None
    return RowSampling.from_params([s.params for s in rows], [s.generator for s in rows], vocab_size)


class RawRows:
    """The raw logits a multi-step copies out for the sequences that want logprobs: flags uint8 [num_seqs],
    out float32 [their tokens, V] (token order), start[s] = out's row of flagged sequence s's first token."""

    def __init__(self, rows, counts: np.ndarray, vocab_size: int):
        self.flags = np.array([s.params.logprobs is not None for s in rows], dtype=np.uint8)        # [S]
        lens = np.where(self.flags == 1, counts, 0)                                                 # [S]
        self.start = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)                   # [S]
        self.out = np.empty((int(lens.sum()), vocab_size), dtype=np.float32)                        # [R, V]

    @staticmethod
    def of(rows, counts: np.ndarray, vocab_size: int) -> RawRows | None:
        return RawRows(rows, counts, vocab_size) if any(s.params.logprobs is not None for s in rows) else None

    def sampler_output(self, rows, kept: list[np.ndarray], tokens: np.ndarray) -> SamplerOutput:
        """Logprobs of the kept tokens (process_rows order: each sequence's kept tokens in turn), from the
        copies of their rows, as the Sampler computes them."""
        raw_index, logprob_rows, row = [], [], 0
        for s, chosen in enumerate(kept):
            if self.flags[s]:
                raw_index.extend(range(self.start[s], self.start[s] + len(chosen)))
                logprob_rows.extend(range(row, row + len(chosen)))
            row += len(chosen)
        raw = torch.from_numpy(self.out[np.asarray(raw_index, dtype=np.int64)])                     # [L, V]
        wanted = max(rows[s].params.logprobs for s in np.flatnonzero(self.flags))
        return with_logprobs(torch.from_numpy(tokens), raw, wanted,
                             None if len(logprob_rows) == row else torch.tensor(logprob_rows, dtype=torch.long))


def row_edits(rows, vocab_size: int, eos_token_ids) -> tuple[LogitEdits, np.ndarray] | tuple[None, None]:
    """The rows' logit edits as a single step makes them now, and how many steps each row's min_tokens
    bans last (int32 [rows]); (None, None) when no row has an edit."""
    if not any(has_logit_edits(s.params) for s in rows):
        return None, None
    edits = rows_edits(rows, vocab_size, eos_token_ids)
    ban_steps = np.array([max(0, s.params.min_tokens - len(s.output_token_ids)) for s in rows], dtype=np.int32)
    return edits, ban_steps


class MultiStep:
    def __init__(self, num_steps: int, scheduler, worker, block_size: int, max_model_len: int,
                 max_num_batched_tokens: int, vocab_size: int, eos_token_ids):
        self.num_steps = num_steps          # N: tokens a sequence per step, at most
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)  # min_tokens bans hold these back
        self.scheduler = scheduler
        self.worker = worker
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.max_num_batched_tokens = max_num_batched_tokens
        self.pending: dict[int, int] = {}   # seq_id -> placeholder drafts appended for the next step
        self.preemptions_seen = 0           # the scheduler's preemption count when they were appended
        self.multi_steps = 0                # steps run in one call (tests and benchmarks read these)
        self.verified_steps = 0             # steps whose placeholders were verified as drafts instead

    def before_schedule(self) -> None:
        """Removes the placeholders when the next step cannot be one call."""
        if not self.pending:
            return
        stats = self.scheduler.stats()
        blocks_needed = sum(-(-(k + 1) // self.block_size) for k in self.pending.values())
        if stats.num_waiting == 0 and stats.num_swapped == 0 and stats.num_running == len(self.pending) \
                and stats.num_free_blocks >= blocks_needed:
            return
        self.drop_placeholders()

    def drop_placeholders(self, only_preempted: bool = False) -> None:
        """Removes the pending placeholders (only_preempted: of sequences a step preempted, which would
        otherwise carry them into their recomputation or swap-in)."""
        for seq_id, k in self.pending.items():
            info = self.scheduler.get_sequence(seq_id)
            if info is None or info.num_draft_tokens != k or info.status == _core.SeqStatus.FINISHED:
                continue
            if not only_preempted or info.status != _core.SeqStatus.RUNNING:
                self.scheduler.remove_tail_tokens(seq_id, k)
        self.pending.clear()

    def run(self, out, step_input, rows) -> tuple | None:
        """A scheduled step holding placeholders, in one call: (result, process_rows, tokens, sampler_output
        (logprobs, or None)) after update; None when the worker does not take it (nothing has run: the
        caller runs the forward and verify())."""
        start = out.logits_start_loc.astype(np.int64)                       # [num_samples + 1]
        counts = np.diff(start)                                             # [num_samples] 1 + k each
        qsl = step_input.query_start_loc                                    # [num_seqs + 1]
        # Every scheduled sequence is sampled and all its tokens are logits rows: decodes and placeholders only.
        whole = len(rows) == len(step_input.seq_lens) and np.array_equal(np.diff(qsl), counts)
        tokens, raw = None, None
        if whole:
            edits, ban_steps = row_edits(rows, self.vocab_size, self.eos_token_ids)
            raw = RawRows.of(rows, counts, self.vocab_size)
            tokens = self.worker.execute_multi_step(step_input, row_sampling(rows, self.vocab_size), edits,
                                                    ban_steps, raw)           # [num_tokens] or None
        if tokens is None:
            return None
        self.multi_steps += 1
        per_seq = [tokens[qsl[i]:qsl[i + 1]] for i in range(len(rows))]   # [1 + k] each
        for seq, chosen in zip(rows, per_seq):
            if len(chosen) > 1:
                self.scheduler.set_draft_tokens(seq.seq_id, chosen[:-1])
        result = self.scheduler.update(tokens, None, num_accepted_tokens=counts)
        process_rows, kept_tokens, kept = self._kept(rows, per_seq, result)
        return result, process_rows, kept_tokens, None if raw is None else raw.sampler_output(rows, kept, kept_tokens)

    def verify(self, out, logits: torch.Tensor, rows) -> tuple:
        """A step whose placeholders ran through the forward (logits fp32 [num_logits, V], out.logits_indices
        order): each sequence keeps its first row's token, the one a single step gives (its argmax, or
        sampled with a single step's noise; a placeholder equal to it keeps its KV, as a verified draft
        does). -> (result, process_rows, tokens, sampler_output (logprobs, or None)). before_schedule() lets
        placeholders into a step only when every running sequence holds them, so every row here is a plain
        decode's."""
        if not all(eligible(s) for s in rows):
            raise RuntimeError("internal: a multi-step verify step holds a row that is not a plain decode")
        self.verified_steps += 1
        first = torch.from_numpy(out.logits_start_loc[:-1].astype(np.int64)).to(logits.device)  # [num_samples]
        first_logits = logits.index_select(0, first).float().contiguous()                        # [num_samples, V]
        raw = RawRows.of(rows, np.ones(len(rows), dtype=np.int64), first_logits.shape[1])
        if raw is not None:                                                  # before any edit, as the Sampler's
            raw.out[:] = first_logits.numpy()[raw.flags == 1]
        edits, _ = row_edits(rows, first_logits.shape[1], self.eos_token_ids)
        if edits is not None:
            edits.apply(first_logits)                                        # as the single step edits them
        sampling = row_sampling(rows, first_logits.shape[1])
        if sampling is None:
            tokens = np.asarray(argmax_rows(first_logits), dtype=np.int64)                       # [num_samples]
        else:
            tokens = cpu_sampler.sample_rows(first_logits, sampling)                             # [num_samples]
        result = self.scheduler.update(tokens, None, num_accepted_tokens=np.ones(len(rows), dtype=np.int64))
        process_rows, kept_tokens, kept = self._kept(rows, [tokens[i:i + 1] for i in range(len(rows))], result)
        return result, process_rows, kept_tokens, None if raw is None else raw.sampler_output(rows, kept, kept_tokens)

    def _kept(self, rows, per_seq, result) -> tuple[list, np.ndarray, list[np.ndarray]]:
        """process_rows, tokens and each sequence's tokens as the scheduler kept them (it drops tokens after a
        stop)."""
        finished = set(result.finished_seq_ids.tolist()) if len(result.finished_seq_ids) else set()
        process_rows, kept = [], []
        for seq, chosen in zip(rows, per_seq):
            if seq.seq_id in finished:
                info = self.scheduler.get_sequence(seq.seq_id)
                if info is not None:
                    chosen = chosen[:max(0, info.num_output_tokens - len(seq.output_token_ids))]
            process_rows.extend([seq] * len(chosen))
            kept.append(chosen)
        return process_rows, (np.concatenate(kept) if kept else np.zeros(0, np.int64)), kept

    def append_placeholders(self, process_rows, allowed: bool = True) -> None:
        """After a step's outputs: placeholders for every running sequence when all are plain decodes
        (allowed: the engine's own conditions, e.g. no beam search in flight)."""
        stats = self.scheduler.stats()
        if self.pending and stats.num_preemptions != self.preemptions_seen:
            self.drop_placeholders(only_preempted=True)   # (looks each pending sequence up: only after a preemption)
        self.pending.clear()
        self.preemptions_seen = stats.num_preemptions
        if not allowed:
            return
        seqs = list({s.seq_id: s for s in process_rows if not s.finished}.values())
        if not seqs or not all(eligible(s) for s in seqs):
            return
        if stats.num_waiting or stats.num_swapped or stats.num_running != len(seqs) or not self.worker.can_multi_step():
            return
        # Every sequence's 1 + k tokens fit the step's token budget (else some would wait a step).
        most = min(self.num_steps, self.max_num_batched_tokens // len(seqs)) - 1
        for seq in seqs:
            num_output = len(seq.output_token_ids)
            num_tokens = len(seq.request.prompt_token_ids) + num_output
            k = most
            if seq.params.max_tokens is not None:
                k = min(k, seq.params.max_tokens - num_output - 1)   # tokens past max_tokens are never kept
            k = min(k, self.max_model_len - num_tokens - 1)
            if k > 0:
                self.scheduler.append_tokens(seq.seq_id, np.full(k, seq.output_token_ids[-1], dtype=np.int64),
                                             draft=True)
                self.pending[seq.seq_id] = k
