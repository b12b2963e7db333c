"""The engine's Python-side state of a request and of each of its samples (sequences).

The C++ scheduler owns tokens, blocks and queues; this side owns what only Python needs: the
sampling params and generator, detokenized text, stop strings, grammar matchers, logprobs and timings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pagedcore.outputs import (CompletionOutput, PromptLogprobs, RequestMetrics, RequestOutput,
                               SampleLogprobs)
from pagedcore.sampling_params import SamplingParams

OUTPUT_KINDS = ("cumulative", "delta", "final")


@dataclass
class SequenceState:
    seq_id: int
    index: int                                  # which of the request's n samples
    request: RequestState
    params: SamplingParams
    generator: torch.Generator | None           # the sample's own generator when seeded
    detokenizer: object | None                  # IncrementalDetokenizer, None when detokenize=False
    stop_checker: object | None                 # StopStringChecker, None without stop strings
    grammar: object | None = None               # xgrammar GrammarMatcher of a constrained sample, else None
    output_token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: SampleLogprobs | None = None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    # What a "delta" consumer has already been given.
    num_sent_tokens: int = 0
    num_sent_chars: int = 0
    num_sent_logprobs: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def completion(self, kind: str) -> CompletionOutput:
        if kind == "delta":
            out = CompletionOutput(
                index=self.index, text=self.text[self.num_sent_chars:],
                token_ids=self.output_token_ids[self.num_sent_tokens:],
                cumulative_logprob=self.cumulative_logprob,
                logprobs=None if self.logprobs is None else self.logprobs[self.num_sent_logprobs:],
                finish_reason=self.finish_reason, stop_reason=self.stop_reason)
            self.num_sent_chars = len(self.text)
            self.num_sent_tokens = len(self.output_token_ids)
            self.num_sent_logprobs = 0 if self.logprobs is None else len(self.logprobs)
            return out
        return CompletionOutput(
            index=self.index, text=self.text, token_ids=list(self.output_token_ids),
            cumulative_logprob=self.cumulative_logprob,
            logprobs=None if self.logprobs is None else list(self.logprobs),
            finish_reason=self.finish_reason, stop_reason=self.stop_reason)


@dataclass
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    metrics: RequestMetrics
    output_kind: str = "cumulative"
    seqs: list[SequenceState] = field(default_factory=list)   # index order; children join at the first sample
    prompt_logprobs: PromptLogprobs | None = None
    prompt_logprobs_sent: bool = False
    needs_fork: bool = False                                  # n > 1 and the first token not yet sampled
    grammar: object | None = None                             # the compiled constraint (structured output)

    @property
    def finished(self) -> bool:
        return not self.needs_fork and all(s.finished for s in self.seqs)

    def make_output(self) -> RequestOutput:
        prompt_logprobs = self.prompt_logprobs
        if self.output_kind == "delta":
            # Prompt logprobs go out once, with the first output that carries them.
            if self.prompt_logprobs_sent:
                prompt_logprobs = None
            elif prompt_logprobs is not None and len(prompt_logprobs) == len(self.prompt_token_ids):
                self.prompt_logprobs_sent = True
            else:
                prompt_logprobs = None
        return RequestOutput(
            request_id=self.request_id, prompt=self.prompt, prompt_token_ids=self.prompt_token_ids,
            prompt_logprobs=prompt_logprobs,
            outputs=[s.completion(self.output_kind) for s in self.seqs], finished=self.finished,
            metrics=self.metrics)
