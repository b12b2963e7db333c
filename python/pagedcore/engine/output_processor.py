"""OutputProcessor: what the engine does with one step's logits besides the forward.

Sampling (with an argmax fast path), n > 1 fan-out, prompt logprobs, grammar masks of constrained
rows (structured output), and turning sampled tokens into text, stop-string matches, grammar
advances, logprobs and RequestOutputs. A stage of the step loop: it gets the registry, the
scheduler and the sampler it works with, and changes requests only through the registry.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from pagedcore import _core
from pagedcore.ops.argmax import argmax_rows
from pagedcore.outputs import RequestOutput
from pagedcore.sampling.grammar_mask import apply_grammar_bitmask_
from pagedcore.sampling.logprobs import gather_logprobs, logprob_dicts
from pagedcore.sampling.metadata import SamplingMetadata
from pagedcore.structured_output.bitmask import GrammarBitmask

if TYPE_CHECKING:
    from pagedcore.engine.request_registry import RequestRegistry
    from pagedcore.engine.request_state import RequestState, SequenceState
    from pagedcore.sampling.sampler import Sampler

logger = logging.getLogger(__name__)

_STOP = int(_core.FinishReason.STOP.value)
_LENGTH = int(_core.FinishReason.LENGTH.value)


def plain_greedy(params) -> bool:
    """Greedy with nothing that changes or reports the logits: argmax alone decides."""
    return params.temperature == 0 and plain_sampling(params)


def plain_sampling(params) -> bool:
    """Nothing changes or reports the logits: the token comes from the row's own distribution under
    temperature / top-k / top-p / min-p (or its argmax) alone."""
    return not has_logit_edits(params) and params.logprobs is None


def has_logit_edits(params) -> bool:
    """Penalties, a logit bias or min_tokens: edits of the logits before the token is drawn
    (sampling/penalties.py; in the one-call step, sampling/logit_edits.py)."""
    return params.has_penalties or bool(params.logit_bias) or params.min_tokens != 0


class OutputProcessor:
    def __init__(self, registry: RequestRegistry, scheduler: _core.Scheduler, sampler: Sampler, tokenizer,
                 vocab_size: int, eos_token_ids: Sequence[int]):
        self.registry = registry
        self.scheduler = scheduler          # asked for cached-token counts; told of stop-string matches
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self._pending_prompt_rows: list[tuple[SequenceState, int, int]] = []
        self.grammar_bitmask = GrammarBitmask(vocab_size)

    def decode_token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id]) if self.tokenizer is not None else ""

    # -- prompt logprobs ---------------------------------------------------------------------------
    def prompt_logprob_rows(self, out) -> np.ndarray | None:
        """Extra logit rows for this step's prompt positions of requests that asked for prompt logprobs."""
        self._pending_prompt_rows = []
        owed = self.registry.owed_prompt_logprobs
        if not owed:
            return None
        rows = []
        qsl, computed, scheduled = out.query_start_loc, out.num_computed_tokens, out.num_scheduled_tokens
        for i, sid in enumerate(out.seq_ids.tolist()):
            seq = owed.get(sid)
            if seq is None:
                continue
            c = int(computed[i])
            hi = min(c + int(scheduled[i]), len(seq.request.prompt_token_ids) - 1)  # row p predicts token p + 1
            if hi > c:
                rows.append(np.arange(qsl[i], qsl[i] + hi - c))
                self._pending_prompt_rows.append((seq, c, hi))
        return np.concatenate(rows).astype(np.int64) if rows else None

    def record_prompt_logprobs(self, out, logits: torch.Tensor) -> None:
        offset = 0
        for seq, lo, hi in self._pending_prompt_rows:
            req = seq.request
            chunk = logits[offset:offset + hi - lo]              # [hi - lo, vocab]
            offset += hi - lo
            if len(req.prompt_logprobs) != lo + 1:               # recomputed after a preemption: have it already
                continue
            targets = torch.as_tensor(req.prompt_token_ids[lo + 1:hi + 1], dtype=torch.long, device=chunk.device)
            n = req.params.prompt_logprobs
            ids, values, ranks = gather_logprobs(chunk.float().log_softmax(-1), targets, n)
            req.prompt_logprobs.extend(logprob_dicts(ids, values, ranks, [n] * (hi - lo), self.decode_token))
            if len(req.prompt_logprobs) == len(req.prompt_token_ids):
                self.registry.prompt_logprobs_done(seq.seq_id)

    # -- sampling ----------------------------------------------------------------------------------
    def expand_forks(self, rows: list[SequenceState]):
        """Children for requests whose first token is sampled this step (n > 1)."""
        fork_rows, forks = [], []
        for seq in rows:
            req = seq.request
            if not req.needs_fork:
                continue
            for index in range(1, req.params.n):
                child = self.registry.add_sample(req, index, req.params.child_params(index))
                fork_rows.append(child)
                forks.append((seq.seq_id, child))
            req.needs_fork = False
        return fork_rows, forks

    def sample(self, logits: torch.Tensor, rows: list[SequenceState], fork_rows: list[SequenceState]):
        """logits [num_samples, vocab] -> sampled int64 numpy [num_samples + num_forks], SamplerOutput or None."""
        all_rows = rows + fork_rows
        if not all_rows:
            return np.zeros(0, dtype=np.int64), None, logits
        if fork_rows:
            parent_row = {s.seq_id: i for i, s in enumerate(rows)}
            index = list(range(len(rows))) + [parent_row[self._parent_of(c)] for c in fork_rows]
            logits = logits.index_select(0, torch.as_tensor(index, device=logits.device))  # [samples + forks, vocab]
        if self.registry.num_constrained:
            self._mask_grammar(logits, all_rows)
        if all(plain_greedy(s.params) for s in all_rows):
            return argmax_rows(logits), None, logits
        md = self.sampling_metadata(all_rows, logits.shape[1], logits.device)
        sampler_output = self.sampler(logits, md)
        return sampler_output.sampled_token_ids.cpu().numpy(), sampler_output, logits

    def sampling_metadata(self, rows: list[SequenceState], vocab_size: int, device) -> SamplingMetadata:
        """The Sampler's inputs for these rows at this step."""
        return SamplingMetadata.from_requests(
            [s.params for s in rows], vocab_size=vocab_size,
            eos_token_ids=self.eos_token_ids,
            prompt_token_ids=[s.request.prompt_token_ids for s in rows],
            output_token_ids=[s.output_token_ids for s in rows],
            generators=[s.generator for s in rows],
            num_output_tokens=[len(s.output_token_ids) for s in rows], device=device)

    def _parent_of(self, child: SequenceState) -> int:
        return child.request.seqs[0].seq_id

    def start_grammar_masks(self, out) -> None:
        """Before the forward: the bitmask of the step's constrained rows starts filling on a worker
        thread (structured_output/bitmask.py, "Early fill"), when a spare core makes that pay."""
        if not self.registry.num_constrained or not self.grammar_bitmask.overlap:
            return
        rows = self.registry.seqs_of(out.sample_seq_ids.tolist())
        self.grammar_bitmask.start_early_fill(
            [s.grammar for s in rows if s.grammar is not None and not s.grammar.is_terminated()])

    def _mask_grammar(self, logits: torch.Tensor, rows: list[SequenceState]) -> None:
        """Forbidden tokens of every constrained row -> -inf: one batched fill, one in-place apply."""
        self.grammar_bitmask.wait()   # an early fill reads the matchers: it ends before they are read here
        row_ids = [i for i, s in enumerate(rows) if s.grammar is not None and not s.grammar.is_terminated()]
        if not row_ids:
            return
        bitmask = self.grammar_bitmask.fill(len(rows), row_ids, [rows[i].grammar for i in row_ids])
        apply_grammar_bitmask_(logits, bitmask, row_ids)

    @staticmethod
    def _advance_grammar(seq: SequenceState, token: int) -> bool:
        """Feeds the sampled token to the sequence's matcher; True when the grammar is done with it."""
        if not seq.grammar.accept_token(token):
            # Only when something after the mask forbade every allowed token (min_tokens banning the
            # EOS a finished grammar needs): the constraint cannot hold any more, so end here.
            logger.warning("request %s: token %d breaks its grammar; ending the sequence",
                           seq.request.request_id, token)
            return True
        return seq.grammar.is_terminated()

    # -- outputs -----------------------------------------------------------------------------------
    def mark_scheduled(self, out, now: float) -> None:
        """Queue time ends when a request is first scheduled (stamped before its forward runs)."""
        for seq in self.registry.take_first_scheduled(out.seq_ids):
            seq.request.metrics.on_scheduled(now)
            info = self.scheduler.get_sequence(seq.seq_id)
            seq.request.metrics.num_cached_tokens = max(0, info.num_cached_tokens) if info else 0

    def process(self, out, all_rows: list[SequenceState], sampled: np.ndarray, sampler_output,
                result) -> list[RequestOutput]:
        now = time.time()
        finished = {}
        if len(result.finished_seq_ids):
            finished = dict(zip(result.finished_seq_ids.tolist(),
                                zip(result.finish_reasons.tolist(), result.stop_token_ids.tolist())))
        dicts = None
        if sampler_output is not None and sampler_output.logprobs is not None:
            dicts = logprob_dicts(sampler_output.logprob_token_ids, sampler_output.logprobs,
                                  sampler_output.sampled_token_ranks, [s.params.logprobs for s in all_rows],
                                  self.decode_token)
        touched: dict[str, RequestState] = {}
        tokens_per_request: dict[str, int] = {}
        tokens = sampled.tolist()
        constrained = self.registry.num_constrained > 0
        if constrained:
            self.grammar_bitmask.discard_early()   # the matchers advance below: an untaken early fill is stale
        # Speculative decoding: a sequence that kept m tokens this step is m rows in a row, after every
        # sampled row; the scheduler's finish belongs to its last one, a stop string may end it earlier.
        last_row = {s.seq_id: j for j, s in enumerate(all_rows)}
        for j, seq in enumerate(all_rows):
            if seq.finished:
                continue
            token = tokens[j]
            req = seq.request
            seq.output_token_ids.append(token)
            # A finished grammar ends the sequence here, as a stop string does (the scheduler is told below).
            grammar_done = constrained and seq.grammar is not None and self._advance_grammar(seq, token)
            if dicts is not None and j < len(dicts) and dicts[j] is not None:
                seq.logprobs.append(dicts[j])
                seq.cumulative_logprob += dicts[j][token].logprob
            fin = finished.get(seq.seq_id) if last_row[seq.seq_id] == j else None
            stopped_by_token = fin is not None and fin[0] == _STOP
            ends = fin is not None or grammar_done
            matched = None
            if seq.detokenizer is not None:
                # A stop token's own text is left out unless asked for (vLLM's behaviour).
                hide = stopped_by_token and not seq.params.include_stop_str_in_output
                delta = "" if hide else seq.detokenizer.add_tokens([token])
                if ends:
                    delta += seq.detokenizer.flush()
                if seq.stop_checker is not None:
                    delta = seq.stop_checker.feed(delta)
                    matched = seq.stop_checker.stop_reason
                    if ends and matched is None:
                        delta += seq.stop_checker.flush()   # held back for a stop string that never came
                seq.text += delta
            if matched is not None:
                if fin is None:
                    self.scheduler.abort_sequence(seq.seq_id)
                seq.finish_reason, seq.stop_reason = "stop", matched
            elif fin is not None:
                seq.finish_reason = "stop" if stopped_by_token else "length"
                if stopped_by_token and token in (seq.params.stop_token_ids or ()):
                    seq.stop_reason = token
            elif grammar_done:
                self.scheduler.abort_sequence(seq.seq_id)
                seq.finish_reason = "stop"
            touched[req.request_id] = req
            tokens_per_request[req.request_id] = tokens_per_request.get(req.request_id, 0) + 1
        outputs = []
        for req in touched.values():
            req.metrics.on_tokens(now, tokens_per_request[req.request_id])
            if req.finished:
                req.metrics.on_finished(now)
                self.registry.finish(req.request_id)
                outputs.append(req.make_output())
            elif req.output_kind != "final":
                outputs.append(req.make_output())
        return outputs
