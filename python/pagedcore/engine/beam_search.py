"""BeamSearch: the engine stage that runs beam-search requests (BeamSearchParams) inside ordinary steps.

A beam-search request starts as one sequence. Each step that samples its live beams:

    logits rows of its beams ─▶ log_softmax (fp32) + each beam's cumulative logprob ─▶ top K per beam
    ─▶ top K of those (K = max(2, 1 + #EOS ids) * beam_width, as HF takes) ─▶ ranked candidates
       ├─ ranked < beam_width and ending (EOS, or max_tokens reached) ─▶ BeamHypotheses (bounded heap)
       └─ the best beam_width that do not end ─▶ the next beams:
            a parent's first continuation is the token its own row takes in Scheduler.update();
            its others are forks (parent, child, token) in the same update: the child shares every
            block of the parent (ref counts), the partial last block is copied on write;
            parents with no continuation are aborted (their blocks go back to the pool).

Beams of one request must be decided together. A step that samples only some of them (a sibling was
preempted, or cut by the batch caps) parks the sampled ones: their K candidates are kept, their
sequence is aborted, and once every beam has candidates the winners of a parked parent re-enter the
scheduler as new sequences of prompt + beam tokens (prefix-cache hits when caching is on).

Numbers follow HF transformers exactly (see beam_hypotheses.py and docs/beam-search.md); no Python
loop touches the vocabulary: one log_softmax and one topk over the step's beam rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from pagedcore.engine.beam_hypotheses import BeamHypotheses
from pagedcore.outputs import CompletionOutput, Logprob, RequestOutput
from pagedcore.sampling_params import BeamSearchParams, SamplingParams

if TYPE_CHECKING:
    from pagedcore.engine.request_registry import RequestRegistry
    from pagedcore.engine.request_state import RequestState, SequenceState


def num_candidates(beam_width: int, num_eos_ids: int) -> int:
    """Candidates kept per step (HF's beams_to_keep): enough that beam_width continue even when the
    best ones all end in one of the EOS ids."""
    return max(2, 1 + num_eos_ids) * beam_width


@dataclass
class _Candidates:
    """The top K continuations of one beam, computed in the step that sampled it."""
    values: torch.Tensor      # float32 [K] cumulative logprob of beam + token, descending
    token_ids: torch.Tensor   # int64 [K]
    logprobs: torch.Tensor    # float32 [K] the token's own logprob


@dataclass
class _Beam:
    seq: SequenceState                     # its registry state (output_token_ids are the beam's tokens)
    cumulative_logprob: float              # float32 value: sum of its tokens' logprobs, in HF's order
    token_logprobs: list[float] = field(default_factory=list)
    live: bool = True                      # has a sequence in the scheduler (False: parked)
    candidates: _Candidates | None = None  # set once sampled this round


@dataclass
class _BeamRequest:
    req: RequestState
    params: BeamSearchParams
    max_tokens: int                        # params.max_tokens cut to what max_model_len leaves
    eos_token_ids: frozenset[int]          # empty with ignore_eos
    num_candidates: int
    priority: int                          # the request's scheduling priority (parked winners keep it)
    hypotheses: BeamHypotheses
    beams: list[_Beam]                     # running beams, best first
    num_generated: int = 0


class BeamStep:
    """One engine step's beam-search work: the other rows to sample as usual, the beam rows' tokens
    and forks for Scheduler.update(), and what to do once it ran."""

    def __init__(self, other_rows, other_logits, beam_positions: np.ndarray, beam_tokens: np.ndarray,
                 forks: list[tuple[int, int, int]], to_add: list[tuple[int, list[int], int, int]],
                 outputs: list[RequestOutput], add_sequence):
        self.other_rows = other_rows              # list[SequenceState] not under beam search
        self.other_logits = other_logits          # [len(other_rows), vocab]
        self._beam_positions = beam_positions     # int64 [num_beam_rows] their sample-row positions
        self._beam_tokens = beam_tokens           # int64 [num_beam_rows] the token each row takes
        self._forks = forks                       # (parent seq id, child seq id, token)
        self._to_add = to_add                     # (seq id, all tokens, max_tokens, priority) of parked winners
        self._outputs = outputs                   # finished requests' RequestOutputs
        self._add_sequence = add_sequence

    def merge(self, other_tokens: np.ndarray, fork_array: np.ndarray | None):
        """other_tokens int64 [len(other_rows)] -> (tokens int64 [num_samples] in sample-row order,
        fork rows int64 [n, 3] with the beams' forks appended)."""
        num_samples = len(other_tokens) + len(self._beam_positions)
        tokens = np.empty(num_samples, dtype=np.int64)
        is_beam = np.zeros(num_samples, dtype=bool)
        is_beam[self._beam_positions] = True
        tokens[is_beam] = self._beam_tokens
        tokens[~is_beam] = other_tokens
        if self._forks:
            beam_forks = np.asarray(self._forks, dtype=np.int64).reshape(-1, 3)
            fork_array = beam_forks if fork_array is None else np.concatenate([fork_array, beam_forks])
        return tokens, fork_array

    def finish(self) -> list[RequestOutput]:
        """After Scheduler.update(): parked winners re-enter the scheduler; finished requests' outputs."""
        for seq_id, token_ids, max_tokens, priority in self._to_add:
            self._add_sequence(seq_id, token_ids, max_tokens, priority)
        return self._outputs


class BeamSearch:
    def __init__(self, registry: RequestRegistry, scheduler, tokenizer, eos_token_ids, vocab_size: int,
                 max_num_seqs: int, max_model_len: int, speculative: bool = False):
        self.registry = registry
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.eos_token_ids = list(eos_token_ids)
        self.vocab_size = vocab_size
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.speculative = speculative      # drafts and beams share no step: refuse beam search then
        self._requests: dict[str, _BeamRequest] = {}
        self._beams: dict[int, tuple[_BeamRequest, _Beam]] = {}   # live or parked beam's seq id -> its beam
        self.num_parked = 0     # beams parked because a sibling was not sampled in the same step

    def __len__(self) -> int:
        return len(self._requests)

    # -- requests ----------------------------------------------------------------------------------
    def sampling_params(self, params: BeamSearchParams, num_prompt_tokens: int,
                        lora_request=None) -> SamplingParams:
        """Checks a beam-search request against the engine and returns the SamplingParams its sequences
        carry in the scheduler: greedy, no EOS stop (the search decides where hypotheses end), no text."""
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"expected BeamSearchParams, got {type(params).__name__}")
        if lora_request is not None:
            raise ValueError("beam search does not run under a LoRA adapter (lora_request); use the base model "
                             "or sample with SamplingParams(n=...)")
        if self.speculative:
            raise ValueError("beam search does not run with speculative decoding; start the engine without "
                             "--speculative-config (speculative_config) to use BeamSearchParams")
        if params.beam_width > self.max_num_seqs:
            raise ValueError(f"BeamSearchParams.beam_width={params.beam_width} is more than the engine runs at once "
                             f"(max_num_seqs={self.max_num_seqs}); use a smaller beam_width or raise --max-num-seqs")
        k = num_candidates(params.beam_width, 0 if params.ignore_eos else len(self.eos_token_ids))
        if k > self.vocab_size:
            raise ValueError(f"BeamSearchParams.beam_width={params.beam_width} needs {k} candidates per step, more "
                             f"than the vocabulary ({self.vocab_size}); use a smaller beam_width")
        if params.temperature != 0:
            raise ValueError(f"BeamSearchParams.temperature must be 0, got {params.temperature!r}: beam search here "
                             "is deterministic (HF generate(num_beams=..., do_sample=False)); drop temperature or "
                             "sample with SamplingParams(n=...) instead")
        max_tokens = min(params.max_tokens, self.max_model_len - num_prompt_tokens)
        return SamplingParams(n=1, temperature=0.0, max_tokens=max(max_tokens, 1), ignore_eos=True,
                              detokenize=False)

    def track(self, req: RequestState, params: BeamSearchParams, priority: int = 0) -> None:
        """Starts the search of a request the engine has just queued (req.seqs[0] in the scheduler)."""
        eos = frozenset() if params.ignore_eos else frozenset(self.eos_token_ids)
        max_tokens = req.params.max_tokens
        beam_request = _BeamRequest(
            req=req, params=params, max_tokens=max_tokens, eos_token_ids=eos, priority=priority,
            num_candidates=num_candidates(params.beam_width, len(eos)),
            hypotheses=BeamHypotheses(params.beam_width, params.length_penalty, params.early_stopping, max_tokens),
            beams=[_Beam(req.seqs[0], 0.0)])
        self._requests[req.request_id] = beam_request
        self._beams[req.seqs[0].seq_id] = (beam_request, beam_request.beams[0])

    def forget(self, request_id: str) -> None:
        """The request was aborted: the engine frees its sequences; parked beams have none."""
        beam_request = self._requests.pop(request_id, None)
        if beam_request is not None:
            for beam in beam_request.beams:
                self._beams.pop(beam.seq.seq_id, None)

    # -- the step ----------------------------------------------------------------------------------
    def begin_step(self, rows: list[SequenceState], logits: torch.Tensor) -> BeamStep | None:
        """rows: the step's sample rows; logits [len(rows), vocab]. None when no beam row was sampled."""
        if not self._requests:
            return None
        beam_positions = [i for i, s in enumerate(rows) if s.seq_id in self._beams]
        if not beam_positions:
            return None
        other_positions = [i for i, s in enumerate(rows) if s.seq_id not in self._beams]
        other_rows = [rows[i] for i in other_positions]
        other_logits = logits[other_positions] if other_positions else logits[:0]   # [num_other, vocab]
        index = torch.as_tensor(beam_positions, device=logits.device)
        logprobs = logits.index_select(0, index).float().log_softmax(dim=-1)        # [num_beam_rows, vocab]
        entries = [self._beams[rows[i].seq_id] for i in beam_positions]
        cumulative = torch.tensor([beam.cumulative_logprob for _, beam in entries],
                                  dtype=torch.float32, device=logits.device)         # [num_beam_rows]
        k = max(br.num_candidates for br, _ in entries)
        values, token_ids = (logprobs + cumulative[:, None]).topk(k, dim=-1)        # [num_beam_rows, k] each
        own = logprobs.gather(1, token_ids)                                          # [num_beam_rows, k]
        values, token_ids, own = values.cpu(), token_ids.cpu(), own.cpu()
        touched: dict[str, _BeamRequest] = {}
        for j, (beam_request, beam) in enumerate(entries):
            kk = beam_request.num_candidates
            beam.candidates = _Candidates(values[j, :kk], token_ids[j, :kk], own[j, :kk])
            touched[beam_request.req.request_id] = beam_request
        row_token: dict[int, int] = {}   # seq id -> the token its row takes in update()
        forks: list[tuple[int, int, int]] = []
        to_add: list[tuple[int, list[int], int, int]] = []
        outputs: list[RequestOutput] = []
        now = time.time()
        for beam_request in touched.values():
            if all(b.candidates is not None for b in beam_request.beams):
                self._decide(beam_request, row_token, forks, to_add, outputs, now)
            else:
                self._park_sampled(beam_request)
        # Rows not continued (parked, dropped, or their request ended) were aborted: any token will do.
        beam_tokens = np.array([row_token.get(rows[i].seq_id, 0) for i in beam_positions], dtype=np.int64)
        return BeamStep(other_rows, other_logits, np.asarray(beam_positions, dtype=np.int64), beam_tokens,
                        forks, to_add, outputs, self._add_sequence)

    def _park_sampled(self, beam_request: _BeamRequest) -> None:
        """Some siblings were not sampled this step: hold the sampled beams' candidates, free their KV."""
        for beam in beam_request.beams:
            if beam.candidates is not None and beam.live:
                self.scheduler.abort_sequence(beam.seq.seq_id)
                beam.live = False
                self.num_parked += 1

    def _decide(self, br: _BeamRequest, row_token: dict, forks: list, to_add: list, outputs: list,
                now: float) -> None:
        width, k = br.params.beam_width, br.num_candidates
        beams = br.beams
        values = torch.cat([b.candidates.values for b in beams])          # [num_beams * k]
        k_top = min(k, values.numel())
        top_values, top_pos = values.topk(k_top)                            # [k_top], descending
        length = br.num_generated + 1                                       # generated length after this step
        at_max = length >= br.max_tokens
        # The ranked candidates: (rank, parent beam, token, cumulative, own logprob)
        ranked = []
        for rank, pos in enumerate(top_pos.tolist()):
            parent = beams[pos // k]
            c = parent.candidates
            ranked.append((rank, parent, int(c.token_ids[pos % k]), top_values[rank], float(c.logprobs[pos % k])))
        ends = [at_max or token in br.eos_token_ids for _, _, token, _, _ in ranked]
        # 1. Hypotheses: only the best beam_width candidates may end here (HF's top_num_beam_mask).
        ending = [r for r, e in zip(ranked, ends) if e and r[0] < width]
        if ending:
            scores = br.hypotheses.score(torch.stack([r[3] for r in ending]), length)   # float32 [num_ending]
            for (_, parent, token, cumulative, own), score in zip(ending, scores.tolist()):
                reason = "length" if token not in br.eos_token_ids else "stop"
                br.hypotheses.add(score, parent.seq.output_token_ids + [token], float(cumulative),
                                  parent.token_logprobs + [own], reason)
        # 2. Next beams: the best beam_width candidates that do not end, in rank order.
        chosen = [r for r, e in zip(ranked, ends) if not e][:width]
        br.num_generated = length
        best = chosen[0][3] if chosen else None
        done = br.hypotheses.update_done(best, length)
        if done:
            chosen = []
        # A live parent's first continuation is its own row's token; the others fork off it. A parked
        # parent has no sequence: each of its continuations re-enters the scheduler as a new one.
        next_beams: list[_Beam] = []
        kept_seqs: set[int] = set()
        for _, parent, token, cumulative, own in chosen:
            if parent.live and parent.seq.seq_id not in kept_seqs:
                kept_seqs.add(parent.seq.seq_id)
                seq = parent.seq
                row_token[seq.seq_id] = token
            else:
                seq = self.registry.fork(parent.seq.seq_id)   # copies the tokens before this step's
                if parent.live:
                    forks.append((parent.seq.seq_id, seq.seq_id, token))
                else:
                    to_add.append((seq.seq_id, br.req.prompt_token_ids + seq.output_token_ids + [token],
                                   br.max_tokens - length, br.priority))
            next_beams.append(_Beam(seq, float(cumulative), parent.token_logprobs + [own]))
        # Parents that continue in none of the next beams end here.
        for beam in beams:
            if beam.seq.seq_id not in kept_seqs:
                if beam.live:
                    self.scheduler.abort_sequence(beam.seq.seq_id)
                self._beams.pop(beam.seq.seq_id, None)
                self.registry.drop_seq(beam.seq.seq_id)
        for beam, (_, _, token, _, _) in zip(next_beams, chosen):
            beam.seq.output_token_ids.append(token)
            beam.seq.cumulative_logprob = beam.cumulative_logprob
            self._beams[beam.seq.seq_id] = (br, beam)
        br.beams = next_beams
        br.req.metrics.on_tokens(now, max(len(next_beams), 1))
        if done or not next_beams:
            outputs.append(self._finish(br, now))

    def _finish(self, br: _BeamRequest, now: float) -> RequestOutput:
        req = br.req
        for beam in br.beams:   # a search stopped early: the running beams end unreturned
            if beam.live:
                self.scheduler.abort_sequence(beam.seq.seq_id)
            self._beams.pop(beam.seq.seq_id, None)
        self._requests.pop(req.request_id, None)
        completions = []
        for index, hyp in enumerate(br.hypotheses.best()):
            text = self._text(hyp.token_ids, hyp.finish_reason, br.params.include_stop_str_in_output)
            completions.append(CompletionOutput(
                index=index, text=text, token_ids=list(hyp.token_ids), cumulative_logprob=hyp.cumulative_logprob,
                logprobs=[{t: Logprob(lp)} for t, lp in zip(hyp.token_ids, hyp.token_logprobs)],
                finish_reason=hyp.finish_reason, stop_reason=None))
        req.metrics.on_finished(now)
        self.registry.finish(req.request_id)
        return RequestOutput(request_id=req.request_id, prompt=req.prompt, prompt_token_ids=req.prompt_token_ids,
                             prompt_logprobs=None, outputs=completions, finished=True, metrics=req.metrics)

    def _text(self, token_ids: list[int], finish_reason: str, include_stop: bool) -> str:
        if self.tokenizer is None:
            return ""
        if finish_reason == "stop" and not include_stop:
            token_ids = token_ids[:-1]      # the EOS that ended it, as SamplingParams leaves it out
            return self.tokenizer.decode(token_ids, skip_special_tokens=True)
        if finish_reason == "stop":
            return (self.tokenizer.decode(token_ids[:-1], skip_special_tokens=True)
                    + self.tokenizer.decode(token_ids[-1:], skip_special_tokens=False))
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def _add_sequence(self, seq_id: int, token_ids: list[int], max_tokens: int, priority: int) -> None:
        self.scheduler.add_sequence(seq_id, np.asarray(token_ids, dtype=np.int64), max_tokens=max_tokens,
                                    ignore_eos=True, eos_token_ids=[], priority=priority)


__all__ = ["BeamSearch", "BeamStep", "num_candidates"]
