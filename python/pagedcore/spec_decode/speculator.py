"""`Speculator`: the engine's speculative decoding, two hooks around the ordinary step.

    step t:   schedule ─▶ forward (K + 1 rows per speculating sequence, mixed with every other row)
              ─▶ verify_step: plain rows sampled as usual, draft rows accepted (rejection_sampler.py)
              ─▶ scheduler.update(tokens, num_accepted_tokens=...) rolls back rejected drafts
              ─▶ outputs ─▶ propose: drafts appended (append_tokens(draft=True)) for step t + 1:
                 ngram: prompt lookup per sequence; draft_model / layer_skip: K single-token batched
                 forwards of the draft (draft_proposer.py), whose probabilities q are kept for verification

Only sequences whose tokens the target decides from logits alone speculate: no logprobs, penalties,
logit_bias, grammar, or min_tokens still to reach. The rest decode one token per step in the same
batch (documented fallback). Adaptive: a step with more unfinished requests than
disable_by_batch_size proposes nothing (seeded requests excepted, so that their draws never depend
on the load), and a sequence whose drafts keep being rejected backs off for 2, 4, ... 64 of its steps.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from pagedcore.ops.argmax import argmax_rows
from pagedcore.spec_decode.config import SpeculativeConfig
from pagedcore.spec_decode.draft_proposer import DraftRequest
from pagedcore.spec_decode.ngram_proposer import propose_ngram
from pagedcore.spec_decode.rejection_sampler import accept_greedy, accept_random, target_probs
from pagedcore.spec_decode.stats import SpecDecodeStats

if TYPE_CHECKING:
    from pagedcore.engine.request_state import SequenceState

logger = logging.getLogger(__name__)

_MAX_BACKOFF = 64


@dataclass
class _SeqSpec:
    """A sequence's speculation state between steps."""

    prompt: np.ndarray        # int64 [P] the prompt, converted once
    misses: int = 0           # verifications in a row with no draft accepted
    skip: int = 0             # steps left without proposing (backoff)
    drafts: np.ndarray | None = None        # int64 [k] a draft model's pending drafts ...
    draft_probs: torch.Tensor | None = None  # fp32 [k, V] ... and their q (temperature > 0 only)


def speculation_eligible(seq: SequenceState) -> bool:
    """True when the target's logits alone decide this sequence's next tokens (see module doc)."""
    p = seq.params
    return (seq.grammar is None and p.logprobs is None and not p.has_penalties and not p.logit_bias
            and len(seq.output_token_ids) >= p.min_tokens and not seq.finished)


class Speculator:
    def __init__(self, config: SpeculativeConfig, scheduler, output_processor, max_model_len: int,
                 max_num_batched_tokens: int, draft=None):
        """draft: the DraftModel / LayerSkipDraft of those methods (spec_decode/draft_setup.py), bound."""
        config.check_against(max_num_batched_tokens)
        self.config = config
        self.draft = draft
        self.scheduler = scheduler
        self.output_processor = output_processor
        self.max_model_len = max_model_len
        self.stats = SpecDecodeStats(config.num_speculative_tokens)
        self._seqs: dict[int, _SeqSpec] = {}

    # -- proposing ---------------------------------------------------------------------------------
    def propose(self, seqs: list[SequenceState], num_unfinished: int) -> int:
        """Appends drafts for the sequences sampled this step. Returns the number of drafts appended."""
        cfg = self.config
        crowded = cfg.disable_by_batch_size is not None and num_unfinished > cfg.disable_by_batch_size
        seen = set()
        total = 0
        requests: list[DraftRequest] = []   # draft_model / layer_skip: proposed for in one batch below
        for seq in seqs:
            sid = seq.seq_id
            if sid in seen:
                continue
            seen.add(sid)
            if (crowded and seq.params.seed is None) or not speculation_eligible(seq):
                if seq.finished:
                    self._seqs.pop(sid, None)
                continue
            state = self._seqs.get(sid)
            if state is None:
                state = self._seqs[sid] = _SeqSpec(np.asarray(seq.request.prompt_token_ids, dtype=np.int64))
            if state.skip:
                state.skip -= 1
                continue
            num_output = len(seq.output_token_ids)
            num_tokens = state.prompt.shape[0] + num_output
            k = cfg.num_speculative_tokens
            if seq.params.max_tokens is not None:
                k = min(k, seq.params.max_tokens - num_output - 1)   # drafts past max_tokens are never kept
            k = min(k, self.max_model_len - num_tokens - 1)
            if k <= 0:
                continue
            if self.draft is not None:
                request = self._draft_request(seq, num_tokens, k)
                if request is not None:
                    requests.append(request)
                continue
            history = np.concatenate([state.prompt, np.asarray(seq.output_token_ids, dtype=np.int64)])  # [L]
            drafts = propose_ngram(history, k, cfg.prompt_lookup_min, cfg.prompt_lookup_max)
            if drafts.size:
                self.scheduler.append_tokens(sid, drafts, draft=True)
                total += int(drafts.size)
        if requests:
            for request, (drafts, q) in zip(requests, self.draft.proposer.propose(requests)):
                sid = request.seq.seq_id
                self.scheduler.append_tokens(sid, drafts, draft=True)
                state = self._seqs[sid]
                state.drafts, state.draft_probs = drafts, q
                total += int(drafts.size)
        if len(self._seqs) > 4 * len(seen) + 256:   # forget sequences aborted while speculating
            self._seqs = {sid: s for sid, s in self._seqs.items() if sid in seen or self._awaits_verification(sid, s)}
        return total

    def _awaits_verification(self, seq_id: int, state: _SeqSpec) -> bool:
        """A draft model's drafts not verified yet (e.g. the sequence was preempted): keep their q."""
        if state.drafts is None:
            return False
        info = self.scheduler.get_sequence(seq_id)
        return info is not None and info.num_draft_tokens > 0

    def _draft_request(self, seq: SequenceState, num_tokens: int, k: int) -> DraftRequest | None:
        """What the draft needs for this sequence: its last token (sampled, no KV yet) and its blocks."""
        info = self.scheduler.get_sequence(seq.seq_id)
        if info is None or info.num_computed_tokens != num_tokens - 1 or info.num_tokens != num_tokens:
            return None   # not in the state a just-sampled sequence is in (e.g. drafts already appended)
        return DraftRequest(seq, int(seq.output_token_ids[-1]), num_tokens - 1, k,
                            np.asarray(info.block_table, dtype=np.int32))

    # -- verifying ---------------------------------------------------------------------------------
    def verify_step(self, out, logits: torch.Tensor, rows: list[SequenceState]):
        """A step with drafts: logits fp32 [num_logits, V] (out.logits_indices order), rows [num_samples]
        (out.sample_seq_ids order). Samples, accepts drafts and updates the scheduler. Returns (result,
        process_rows, tokens, sampler_output) for OutputProcessor.process: a sequence that kept m
        tokens appears m times in process_rows, its tokens in order."""
        op = self.output_processor
        self.stats.begin_step()
        start = out.logits_start_loc.astype(np.int64)                 # [num_samples + 1]
        num_rows = np.diff(start)                                      # [num_samples] k + 1
        num_samples = num_rows.shape[0]
        plain = np.flatnonzero(num_rows == 1)                          # [Np] samples without drafts
        spec = np.flatnonzero(num_rows > 1)                            # [Ns] samples with drafts

        # Rows without drafts: the ordinary sampler (n > 1 forks, logprobs, grammar ... all as usual).
        plain_rows = [rows[i] for i in plain]
        fork_rows, forks = op.expand_forks(plain_rows)
        sampled_plain = np.zeros(0, dtype=np.int64)
        sampler_output = None
        if plain_rows:
            last = torch.from_numpy(start[1:][plain] - 1).to(logits.device)  # [Np] each sample's one row
            sampled_plain, sampler_output, _ = op.sample(logits.index_select(0, last), plain_rows, fork_rows)

        # Rows with drafts: accept a prefix, then the target's own token.
        accepted: dict[int, np.ndarray] = {}                           # sample index -> tokens [a + 1]
        input_ids, logits_indices = out.input_ids, out.logits_indices
        drafts_of = {int(i): input_ids[logits_indices[start[i]:start[i + 1] - 1] + 1].astype(np.int64)
                     for i in spec}                                    # [k] each
        greedy = [int(i) for i in spec if rows[i].params.temperature == 0]
        random = [int(i) for i in spec if rows[i].params.temperature != 0]
        if greedy:
            num_greedy_rows = int(num_rows[greedy].sum())
            if 2 * num_greedy_rows >= logits.shape[0]:
                # Mostly draft rows (single-stream decode): one argmax over every row, no gather copy.
                argmax = argmax_rows(logits)                                             # [num_logits]
                for i in greedy:
                    accepted[i] = accept_greedy(argmax[start[i]:start[i + 1]], drafts_of[i])
            else:
                idx = np.concatenate([np.arange(start[i], start[i + 1]) for i in greedy])   # [Rg]
                argmax = argmax_rows(logits.index_select(0, torch.from_numpy(idx).to(logits.device)))
                offset = 0
                for i in greedy:
                    n = int(num_rows[i])
                    accepted[i] = accept_greedy(argmax[offset:offset + n], drafts_of[i])
                    offset += n
        if random:
            idx = np.concatenate([np.arange(start[i], start[i + 1]) for i in random])       # [Rr]
            params = [rows[i].params for i in random for _ in range(int(num_rows[i]))]
            probs = target_probs(logits.index_select(0, torch.from_numpy(idx).to(logits.device)), params)  # [Rr, V]
            offset = 0
            for i in random:
                n = int(num_rows[i])
                accepted[i] = accept_random(probs[offset:offset + n], drafts_of[i], rows[i].generator,
                                            self._draft_probs(rows[i].seq_id, drafts_of[i], probs.device))
                offset += n
        for i in spec:
            self._record(rows[i].seq_id, int(num_rows[i]) - 1, accepted[int(i)].shape[0] - 1)

        # One flat token list in sample order, and counts.
        per_sample = [None] * num_samples
        for pos, i in enumerate(plain):
            per_sample[i] = sampled_plain[pos:pos + 1]
        for i, tokens in accepted.items():
            per_sample[i] = tokens
        counts = np.array([t.shape[0] for t in per_sample], dtype=np.int64)         # [num_samples]
        flat = np.concatenate(per_sample).astype(np.int64) if num_samples else np.zeros(0, np.int64)
        fork_array = None
        if forks:
            fork_array = np.array([(p, c.seq_id, int(sampled_plain[len(plain_rows) + j]))
                                   for j, (p, c) in enumerate(forks)], dtype=np.int64)
        result = self.scheduler.update(flat, fork_array, num_accepted_tokens=counts)

        # The scheduler drops tokens after a stop (EOS, stop id, max_tokens, length): keep what it kept.
        finished = set(result.finished_seq_ids.tolist()) if len(result.finished_seq_ids) else set()
        process_rows = plain_rows + fork_rows
        tokens_out = [sampled_plain]
        for i in spec:
            seq, tokens = rows[i], accepted[int(i)]
            if seq.seq_id in finished:
                info = self.scheduler.get_sequence(seq.seq_id)
                if info is not None:
                    tokens = tokens[:max(0, info.num_output_tokens - len(seq.output_token_ids))]
            process_rows.extend([seq] * tokens.shape[0])
            tokens_out.append(tokens)
        return result, process_rows, np.concatenate(tokens_out), sampler_output

    def _draft_probs(self, seq_id: int, drafts: np.ndarray, device) -> torch.Tensor | None:
        """The q a draft model drew these drafts from; None for n-gram drafts (point masses)."""
        if self.draft is None:
            return None
        state = self._seqs.get(seq_id)
        if state is None or state.draft_probs is None or not np.array_equal(state.drafts, drafts):
            raise RuntimeError(f"internal: sequence {seq_id} verifies drafts {drafts.tolist()} whose draft "
                               "probabilities were not kept at proposal")
        q = state.draft_probs.to(device)
        state.drafts = state.draft_probs = None
        return q

    def observe_step(self, step, out) -> None:
        """After the target's forward of each step: a draft model runs the same rows (draft_model.py)."""
        if self.draft is not None:
            self.draft.observe_step(step, out)

    def _record(self, seq_id: int, num_drafts: int, num_accepted: int) -> None:
        self.stats.record(num_drafts, num_accepted)
        state = self._seqs.get(seq_id)
        if state is None:
            return
        state.drafts = state.draft_probs = None     # verified: nothing pending
        if num_accepted:
            state.misses = 0
            return
        state.misses += 1
        after = self.config.backoff_after_misses
        if after and state.misses >= after:
            state.skip = min(_MAX_BACKOFF, 2 ** (state.misses - after + 1))
