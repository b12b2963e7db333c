"""What a request hands back: `RequestOutput` holding one `CompletionOutput` per sample, with
per-position `Logprob`s and `RequestMetrics` timings. Shaped like vLLM's so client code ports over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FinishReason = Literal["stop", "length", "abort"]


@dataclass
class Logprob:
    """One candidate token at one position."""

    logprob: float  # natural log of its probability under the model's raw distribution
    rank: int | None = None  # 1 = most likely; counts every token at least as likely, itself included
    decoded_token: str | None = None


# One dict per generated position: token id -> Logprob (the sampled token plus the top-N).
SampleLogprobs = list[dict[int, Logprob]]
# One per prompt position; the first is None (nothing predicts the first prompt token).
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass
class CompletionOutput:
    """One of the n samples of a request."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None  # None unless logprobs were requested
    logprobs: SampleLogprobs | None = None
    finish_reason: FinishReason | None = None  # None while still generating
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it; None for EOS/length

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """Wall-clock timestamps (seconds, one clock per engine) of one request's life."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    time_in_queue: float | None = None  # first_scheduled_time - arrival_time
    num_generation_tokens: int = 0  # over all n samples
    num_samples: int = 1  # n: TPOT is per sample, and the samples advance together
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache

    def on_scheduled(self, now: float) -> None:
        # Only the first time counts: a preempted request that is rescheduled keeps its queue time.
        if self.first_scheduled_time is None:
            self.first_scheduled_time = now
            self.time_in_queue = now - self.arrival_time

    def on_tokens(self, now: float, num_tokens: int = 1) -> None:
        if self.first_token_time is None:
            self.first_token_time = now
        self.last_token_time = now
        self.num_generation_tokens += num_tokens

    def on_finished(self, now: float) -> None:
        self.finished_time = now

    @property
    def time_to_first_token(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float | None:
        if self.finished_time is None:
            return None
        return self.finished_time - self.arrival_time

    @property
    def time_per_output_token(self) -> float | None:
        """Mean inter-token latency after the first token (TPOT) of one sample; None below two tokens."""
        per_sample = self.num_generation_tokens / max(self.num_samples, 1)
        if per_sample < 2 or self.first_token_time is None or self.last_token_time is None:
            return None
        return (self.last_token_time - self.first_token_time) / (per_sample - 1)


@dataclass
class RequestOutput:
    """The state of one request as streamed or returned: prompt, samples so far, timings."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None

    @property
    def num_cached_tokens(self) -> int | None:
        return None if self.metrics is None else self.metrics.num_cached_tokens


@dataclass
class BeamSearchSequence:
    """One returned beam of LLM.beam_search (vLLM's fields)."""

    tokens: list[int]  # the prompt's tokens, then the beam's (its EOS included when it ended there)
    logprobs: SampleLogprobs  # one {token id: Logprob} per generated token: the chosen token's
    lora_request: None = None  # no adapters here; kept so vLLM code that reads it ports over
    cum_logprob: float = 0.0  # sum of the generated tokens' logprobs
    text: str | None = None  # the whole sequence decoded, prompt included, as vLLM's LLM.beam_search gives
    finish_reason: FinishReason | None = None  # "stop" (EOS) or "length" (max_tokens)
    stop_reason: int | str | None = None


@dataclass
class BeamSearchOutput:
    """The beam_width best beams of one prompt, best first (HF's length-penalised score)."""

    sequences: list[BeamSearchSequence]


__all__ = [
    "FinishReason", "Logprob", "SampleLogprobs", "PromptLogprobs",
    "CompletionOutput", "RequestMetrics", "RequestOutput", "BeamSearchSequence", "BeamSearchOutput",
]
