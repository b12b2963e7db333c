"""Engine outputs -> TGIS messages: a request's progress, its stop reason, token details and the
GenerationResponse messages of Generate (one per prompt) and GenerateStream (input, then deltas).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedcore.outputs import CompletionOutput, Logprob, RequestOutput
from pagedcore.serving.grpc.params import FittedPrompt, GenerationPlan, TokenDetail
from pagedcore.serving.grpc.stubs import generation_pb2 as pb

StopReason = pb.StopReason


@dataclass
class Progress:
    """What one request has produced so far, summed from the engine's delta outputs (a single final
    output sums to the same thing)."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def add(self, output: RequestOutput) -> CompletionOutput:
        """Adds one output; returns its (first and only) sample's delta."""
        delta = output.outputs[0]
        self.text += delta.text
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs:
            self.logprobs.extend(delta.logprobs)
        if output.prompt_logprobs is not None:
            self.prompt_logprobs = output.prompt_logprobs
        self.finish_reason, self.stop_reason = delta.finish_reason, delta.stop_reason
        return delta


def stop_reason(finish_reason: str | None, engine_stop_reason: int | str | None, *, token_limited: bool,
                time_limited: bool) -> tuple[int, str]:
    """(fmaas.StopReason, stop_sequence) for a request's state."""
    if finish_reason is None:
        return (StopReason.TIME_LIMIT if time_limited else StopReason.NOT_FINISHED), ""
    if finish_reason == "length":
        # Cut to fit max_model_len rather than what the client asked: TGIS calls that TOKEN_LIMIT.
        return (StopReason.TOKEN_LIMIT if token_limited else StopReason.MAX_TOKENS), ""
    if finish_reason == "stop":
        if isinstance(engine_stop_reason, str):
            return StopReason.STOP_SEQUENCE, engine_stop_reason
        return StopReason.EOS_TOKEN, ""   # EOS (None) or a stop token id
    return StopReason.CANCELLED, ""       # "abort": the server ended it (shutdown)


def token_infos(tokenizer, token_ids: list[int], logprobs: list[dict[int, Logprob] | None] | None,
                detail: TokenDetail) -> list:
    """One fmaas.TokenInfo per token: its vocabulary text (as TGIS returns it, e.g. "ĠParis") and the
    asked-for logprob, rank and top candidates. A position without logprobs (the first prompt
    token, which nothing predicts) carries its text only."""
    texts = tokenizer.convert_ids_to_tokens(token_ids)
    infos = []
    for i, (token_id, text) in enumerate(zip(token_ids, texts)):
        info = pb.TokenInfo(text=text)
        candidates = logprobs[i] if logprobs is not None and i < len(logprobs) else None
        if candidates:
            chosen = candidates.get(token_id)
            if chosen is not None:
                if detail.logprobs:
                    info.logprob = chosen.logprob
                if detail.ranks and chosen.rank is not None:
                    info.rank = chosen.rank
            if detail.top_n:
                # The dict holds the top N plus the chosen token: the N most likely are the top N.
                best = sorted(candidates.items(), key=lambda item: item[1].logprob, reverse=True)[:detail.top_n]
                best_texts = tokenizer.convert_ids_to_tokens([tid for tid, _ in best])
                info.top_tokens.extend(pb.TokenInfo.TopToken(text=t, logprob=lp.logprob)
                                       for t, (_, lp) in zip(best_texts, best))
        infos.append(info)
    return infos


def _add_input_details(response, tokenizer, prompt: FittedPrompt, prompt_logprobs, plan: GenerationPlan) -> None:
    response.input_token_count = len(prompt.token_ids)
    if plan.seed is not None:
        response.seed = plan.seed
    if plan.detail.input_tokens:
        response.input_tokens.extend(token_infos(tokenizer, prompt.token_ids, prompt_logprobs, plan.detail))


def generation_response(tokenizer, prompt: FittedPrompt, prompt_text: str, plan: GenerationPlan,
                        progress: Progress, *, time_limited: bool):
    """The whole answer to one prompt of a Generate call."""
    reason, stop_sequence = stop_reason(progress.finish_reason, progress.stop_reason,
                                        token_limited=prompt.token_limited, time_limited=time_limited)
    response = pb.GenerationResponse(
        generated_token_count=len(progress.token_ids), stop_reason=reason, stop_sequence=stop_sequence,
        text=(prompt_text if plan.detail.input_text else "") + progress.text)
    _add_input_details(response, tokenizer, prompt, progress.prompt_logprobs, plan)
    if plan.detail.generated_tokens:
        response.tokens.extend(token_infos(tokenizer, progress.token_ids, progress.logprobs, plan.detail))
    return response


def stream_input_message(tokenizer, prompt: FittedPrompt, prompt_text: str, plan: GenerationPlan,
                         prompt_logprobs):
    """GenerateStream's first message: the input side (token count, input tokens, input text, seed)."""
    response = pb.GenerationResponse(text=prompt_text if plan.detail.input_text else "")
    _add_input_details(response, tokenizer, prompt, prompt_logprobs, plan)
    return response


def stream_delta_message(tokenizer, prompt: FittedPrompt, plan: GenerationPlan, delta: CompletionOutput,
                         progress: Progress, *, time_limited: bool = False):
    """A GenerateStream message after the first: new text and tokens, the running token count, and
    the stop reason (NOT_FINISHED until the last)."""
    reason, stop_sequence = stop_reason(progress.finish_reason, progress.stop_reason,
                                        token_limited=prompt.token_limited, time_limited=time_limited)
    response = pb.GenerationResponse(text=delta.text, generated_token_count=len(progress.token_ids),
                                     stop_reason=reason, stop_sequence=stop_sequence)
    if plan.detail.generated_tokens and delta.token_ids:
        response.tokens.extend(token_infos(tokenizer, list(delta.token_ids), delta.logprobs, plan.detail))
    return response


def time_limit_message(progress: Progress):
    """The last GenerateStream message when time_limit_millis ran out between outputs."""
    return pb.GenerationResponse(generated_token_count=len(progress.token_ids), stop_reason=StopReason.TIME_LIMIT)


__all__ = ["Progress", "stop_reason", "token_infos", "generation_response", "stream_input_message",
           "stream_delta_message", "time_limit_message"]
