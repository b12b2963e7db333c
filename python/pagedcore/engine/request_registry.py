"""RequestRegistry: the one owner of the engine's Python-side requests and sequences.

The engine adds, forks, finishes and aborts through it; the output processor updates the
SequenceStates it hands out (tokens, text, logprobs) but never its tables. The C++ scheduler keeps
its own side (tokens, blocks, queues) under the same sequence ids.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from pagedcore.engine.detokenizer import IncrementalDetokenizer, StopStringChecker
from pagedcore.engine.request_state import RequestState, SequenceState
from pagedcore.outputs import RequestMetrics
from pagedcore.sampling.metadata import make_generator
from pagedcore.sampling_params import SamplingParams
from pagedcore.structured_output.compiler import new_matcher


class RequestRegistry:
    def __init__(self, tokenizer=None, device: torch.device | str = "cpu"):
        self.tokenizer = tokenizer          # None: no detokenizers, token ids only
        self.device = device                # where seeded sequences' generators live
        self._requests: dict[str, RequestState] = {}
        self._seqs: dict[int, SequenceState] = {}
        self._seq_ids = itertools.count()
        self._unscheduled: set[str] = set()                          # request ids never scheduled yet
        self._owed_prompt_logprobs: dict[int, SequenceState] = {}   # seq id -> seq still owed prompt logprobs
        # Live requests under a grammar: 0 lets the step skip every structured-output stage unlooked.
        self.num_constrained = 0

    # -- lifecycle ---------------------------------------------------------------------------------
    def new_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams, metrics: RequestMetrics, output_kind: str = "cumulative",
                    grammar=None) -> RequestState:
        """A request with its first sequence (the others of n > 1 join at the first sample), not yet
        registered: the engine adds it once the scheduler has taken req.seqs[0]. grammar: the compiled
        constraint of params.structured_outputs (each sequence gets its own matcher of it)."""
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        req = RequestState(request_id, prompt, prompt_token_ids, params, metrics,
                           output_kind=output_kind, needs_fork=params.n > 1, grammar=grammar)
        self._new_seq(req, 0, params)
        return req

    def add(self, req: RequestState) -> None:
        """Registers a request from new_request."""
        if req.request_id in self._requests:
            raise ValueError(f"request id {req.request_id!r} is already in use")
        self._requests[req.request_id] = req
        self._unscheduled.add(req.request_id)
        if req.grammar is not None:
            self.num_constrained += 1
        for seq in req.seqs:
            self._seqs[seq.seq_id] = seq
        if req.params.prompt_logprobs is not None:
            req.prompt_logprobs = [None]            # nothing predicts the first prompt token
            self._owed_prompt_logprobs[req.seqs[0].seq_id] = req.seqs[0]

    def add_sample(self, req: RequestState, index: int, params: SamplingParams) -> SequenceState:
        """A fresh sequence of a live request (n > 1 at its first sample: nothing generated to copy yet)."""
        seq = self._new_seq(req, index, params)
        self._seqs[seq.seq_id] = seq
        return seq

    def fork(self, seq_id: int, index: int | None = None) -> SequenceState:
        """A new sequence of the same request that continues from where seq_id stands (beam search):
        its tokens, text, detokenizer, stop checker, grammar matcher, logprobs and generator state are copied, so
        the two then advance independently. The caller forks the scheduler's side under the new id."""
        parent = self._seqs[seq_id]
        req = parent.request
        generator = None
        if parent.generator is not None:
            generator = torch.Generator(device=parent.generator.device)
            generator.set_state(parent.generator.get_state())
        child = SequenceState(
            seq_id=next(self._seq_ids), index=len(req.seqs) if index is None else index, request=req,
            params=parent.params, generator=generator,
            detokenizer=None if parent.detokenizer is None else parent.detokenizer.fork(),
            stop_checker=None if parent.stop_checker is None else parent.stop_checker.fork(),
            grammar=None if parent.grammar is None else parent.grammar.fork(),
            output_token_ids=list(parent.output_token_ids), text=parent.text,
            # A new list; its entries (one dict per token) are never changed once appended.
            logprobs=None if parent.logprobs is None else list(parent.logprobs),
            cumulative_logprob=parent.cumulative_logprob)
        req.seqs.append(child)
        self._seqs[child.seq_id] = child
        return child

    def drop_seq(self, seq_id: int) -> None:
        """Forgets one sequence of a live request (a beam that beam search dropped); the caller has
        freed its scheduler side."""
        seq = self._seqs.pop(seq_id, None)
        if seq is not None:
            seq.request.seqs[:] = [s for s in seq.request.seqs if s is not seq]
            self._owed_prompt_logprobs.pop(seq_id, None)

    def finish(self, request_id: str) -> RequestState | None:
        """Forgets a request that has finished (every sequence has its finish reason)."""
        req = self._requests.pop(request_id, None)
        if req is not None:
            self._forget_seqs(req)
        return req

    def abort(self, request_id: str) -> RequestState | None:
        """Forgets a request at once; its unfinished sequences end with "abort". None if unknown.
        The caller frees the scheduler's side of each of req.seqs."""
        req = self._requests.pop(request_id, None)
        if req is None:
            return None
        req.needs_fork = False
        self._unscheduled.discard(request_id)
        for seq in req.seqs:
            if not seq.finished:
                seq.finish_reason = "abort"
        self._forget_seqs(req)
        return req

    # -- lookup ------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._requests)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def request_ids(self) -> list[str]:
        return list(self._requests)

    def get_request(self, request_id: str) -> RequestState | None:
        return self._requests.get(request_id)

    def get_seq(self, seq_id: int) -> SequenceState | None:
        return self._seqs.get(seq_id)

    def seqs_of(self, seq_ids: Sequence[int]) -> list[SequenceState]:
        """The live sequences of the given ids, in that order (the step's sampling rows)."""
        seqs = self._seqs
        return [seqs[sid] for sid in seq_ids]

    # -- what the step loop asks -------------------------------------------------------------------
    def take_first_scheduled(self, seq_ids: np.ndarray) -> list[SequenceState]:
        """seq_ids int64 [num_seqs]: the step's batch. Those whose request is scheduled for the first
        time (each once); nothing to look at, and no per-sequence work, once every request has been."""
        if not self._unscheduled:
            return []
        first = []
        for sid in seq_ids.tolist():
            seq = self._seqs.get(sid)
            if seq is not None and seq.request.request_id in self._unscheduled:
                self._unscheduled.discard(seq.request.request_id)
                first.append(seq)
        return first

    @property
    def owed_prompt_logprobs(self) -> Mapping[int, SequenceState]:
        """seq id -> sequence whose request still waits for prompt logprobs (read it; do not change it)."""
        return self._owed_prompt_logprobs

    def prompt_logprobs_done(self, seq_id: int) -> None:
        self._owed_prompt_logprobs.pop(seq_id, None)

    # -- internals ---------------------------------------------------------------------------------
    def _new_seq(self, req: RequestState, index: int, params: SamplingParams) -> SequenceState:
        seq = SequenceState(
            seq_id=next(self._seq_ids), index=index, request=req, params=params,
            generator=make_generator(params, self.device),
            detokenizer=self._make_detokenizer(req, params),
            stop_checker=StopStringChecker(params.stop, params.include_stop_str_in_output) if params.stop else None,
            grammar=None if req.grammar is None else new_matcher(req.grammar),
            logprobs=[] if params.logprobs is not None else None,
            cumulative_logprob=0.0 if params.logprobs is not None else None)
        req.seqs.append(seq)
        return seq

    def _make_detokenizer(self, req: RequestState, params: SamplingParams) -> IncrementalDetokenizer | None:
        if not params.detokenize or self.tokenizer is None:
            return None
        return IncrementalDetokenizer(self.tokenizer, req.prompt_token_ids,
                                      skip_special_tokens=params.skip_special_tokens,
                                      spaces_between_special_tokens=params.spaces_between_special_tokens)

    def _forget_seqs(self, req: RequestState) -> None:
        if req.grammar is not None:
            self.num_constrained -= 1
        for seq in req.seqs:
            self._seqs.pop(seq.seq_id, None)
            self._owed_prompt_logprobs.pop(seq.seq_id, None)
