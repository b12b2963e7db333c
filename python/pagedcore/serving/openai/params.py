"""An OpenAI request's fields -> a validated SamplingParams, checked against the server's limits.

Range rules live in SamplingParams (shared with gRPC and the offline API); this adds what only the
server knows: max_model_len, the vocabulary, --max-logprobs, --max-num-seqs, the scheduling policy.
"""

from __future__ import annotations

from pagedcore.sampling_params import BeamSearchParams, SamplingParams, StructuredOutputsParams
from pagedcore.serving.openai.errors import APIError, bad_request, from_value_error
from pagedcore.serving.openai.protocol import SamplingFields
from pagedcore.serving.state import ServerState


def sampling_params(req: SamplingFields, state: ServerState, *, prompt_len: int, max_tokens: int | None,
                    default_max_tokens: int | None, logprobs: int | None, prompt_logprobs: int | None = None,
                    names: dict[str, str] | None = None, prompt_field: str = "prompt",
                    structured_outputs: StructuredOutputsParams | None = None) -> SamplingParams:
    """names: SamplingParams field -> the request field that set it, for messages (chat's
    top_logprobs sets logprobs; max_completion_tokens may set max_tokens). default_max_tokens: used
    when the request sets none, cut to what fits (None: all that fits)."""
    names = names or {}
    d = state.generation_defaults
    try:
        params = SamplingParams(
            n=req.n, temperature=_pick(req.temperature, d, "temperature", 1.0),
            top_p=_pick(req.top_p, d, "top_p", 1.0), top_k=_pick(req.top_k, d, "top_k", 0),
            min_p=_pick(req.min_p, d, "min_p", 0.0), seed=req.seed,
            presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
            repetition_penalty=_pick(req.repetition_penalty, d, "repetition_penalty", 1.0),
            stop=req.stop, stop_token_ids=req.stop_token_ids,
            include_stop_str_in_output=req.include_stop_str_in_output, ignore_eos=req.ignore_eos,
            max_tokens=max_tokens, min_tokens=req.min_tokens, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
            logit_bias=_logit_bias(req.logit_bias, state.vocab_size),
            skip_special_tokens=req.skip_special_tokens,
            spaces_between_special_tokens=req.spaces_between_special_tokens,
            structured_outputs=structured_outputs)
    except ValueError as error:
        raise from_value_error(error, names) from None
    _check_server_limits(params, req, state, names)
    params.max_tokens = _fit_max_tokens(params, state.max_model_len, prompt_len, max_tokens, default_max_tokens,
                                        names.get("max_tokens", "max_tokens"), prompt_field)
    return params


# Fields that change what is sampled and that beam search does not take: field -> its neutral values
# (clients that send every field at its default are not refused).
_NOT_WITH_BEAM_SEARCH = {"top_p": (1.0,), "top_k": (0, -1), "min_p": (0.0,), "presence_penalty": (0.0,),
                         "frequency_penalty": (0.0,), "repetition_penalty": (1.0,), "logit_bias": ({},),
                         "stop": ("", []), "stop_token_ids": ([],), "min_tokens": (0,), "skip_special_tokens": (True,),
                         "prompt_logprobs": ()}


def beam_search_params(req: SamplingFields, state: ServerState, *, prompt_len: int, max_tokens: int | None,
                       default_max_tokens: int | None, logprobs, names: dict[str, str] | None = None,
                       prompt_field: str = "prompt", constrained_by: str | None = None) -> BeamSearchParams:
    """use_beam_search=true: n is the beam width (the n best beams come back). Streaming, logprobs,
    temperature > 0 and every sampling-only field are refused with a 400 naming the field."""
    names = names or {}
    if req.stream:
        raise bad_request("use_beam_search does not stream (the beams are known only at the end); "
                          "set stream to false", "stream")
    if logprobs:
        field = names.get("logprobs", "logprobs")
        raise bad_request(f"{field} is not supported with use_beam_search; drop it", field)
    if constrained_by is not None:
        raise bad_request(f"{constrained_by} is not supported with use_beam_search; drop one of them", constrained_by)
    if req.temperature:
        raise bad_request(f"use_beam_search is deterministic: temperature must be 0 or unset, got {req.temperature}",
                          "temperature")
    for field, neutral in _NOT_WITH_BEAM_SEARCH.items():
        value = getattr(req, field)
        if value is not None and value not in neutral:
            raise bad_request(f"{field} is not supported with use_beam_search; drop it or turn beam search off",
                              field)
    if req.n > state.max_num_seqs:
        raise bad_request(f"n={req.n} beams are more than this server runs at once (--max-num-seqs "
                          f"{state.max_num_seqs}); ask for fewer beams", "n")
    max_tokens = _fit_max_tokens(SamplingParams(max_tokens=None), state.max_model_len, prompt_len, max_tokens,
                                 default_max_tokens, names.get("max_tokens", "max_tokens"), prompt_field)
    try:
        return BeamSearchParams(beam_width=req.n, max_tokens=max_tokens, ignore_eos=req.ignore_eos,
                                length_penalty=req.length_penalty, early_stopping=req.early_stopping,
                                include_stop_str_in_output=req.include_stop_str_in_output)
    except ValueError as error:   # "BeamSearchParams.<field> must be ...": name the request's field
        field = str(error).split()[0].removeprefix("BeamSearchParams.")
        field = "n" if field == "beam_width" else field
        raise bad_request(str(error).replace("BeamSearchParams.beam_width", "n").removeprefix("BeamSearchParams."),
                          field) from None


def requested_prompt_logprobs(req: SamplingFields, state: ServerState) -> int | None:
    """The request's prompt_logprobs with vLLM's -1 (the whole vocabulary) resolved to the vocabulary
    size and held to --max-logprobs, so the refusal can name the flag value that would allow it."""
    value = req.prompt_logprobs
    if value == -1:
        value = state.vocab_size
        if value > state.max_logprobs:
            raise bad_request(f"prompt_logprobs=-1 asks for the whole vocabulary ({value} tokens per position), "
                              f"more than this server's limit of {state.max_logprobs}; ask for fewer or start the "
                              f"server with --max-logprobs {value}", "prompt_logprobs")
    return value


def _pick(value, defaults: dict, name: str, fallback):
    return value if value is not None else defaults.get(name, fallback)


def _logit_bias(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float] | None:
    if bias is None:
        return None
    out = {}
    for key, value in bias.items():
        if not key.strip().isdigit():
            raise bad_request(f"logit_bias keys must be token ids written as strings, like {{\"50256\": -100}}; "
                              f"got {key!r}", "logit_bias")
        token_id = int(key)
        if token_id >= vocab_size:
            raise bad_request(f"logit_bias has token id {token_id}, outside this model's vocabulary "
                              f"[0, {vocab_size})", "logit_bias")
        out[token_id] = value
    return out


def _check_server_limits(params: SamplingParams, req: SamplingFields, state: ServerState,
                         names: dict[str, str]) -> None:
    if params.n > state.max_num_seqs:
        raise bad_request(f"n={params.n} is more than this server runs at once (--max-num-seqs "
                          f"{state.max_num_seqs}); ask for fewer samples", "n")
    for field in ("logprobs", "prompt_logprobs"):
        value = getattr(params, field)
        if value is not None and value > state.max_logprobs:
            name = names.get(field, field)
            raise bad_request(f"{name}={value} is more than this server's limit of {state.max_logprobs}; ask for "
                              f"fewer or start the server with --max-logprobs {value}", name)
    if req.priority != 0 and not state.priority_scheduling:
        raise bad_request("priority only takes effect with --scheduling-policy priority; drop it from the "
                          "request or restart the server with that flag", "priority")
    bad = [t for t in params.stop_token_ids if t >= state.vocab_size]
    if bad:
        raise bad_request(f"stop_token_ids has {bad[0]}, outside this model's vocabulary [0, {state.vocab_size})",
                          "stop_token_ids")


def _fit_max_tokens(params: SamplingParams, max_model_len: int, prompt_len: int, requested: int | None,
                    default: int | None, field: str, prompt_field: str) -> int:
    room = max_model_len - prompt_len
    if room <= 0:
        raise APIError(400, f"the prompt has {prompt_len} tokens but this model's maximum context length is "
                            f"{max_model_len} tokens, which leaves no room to generate; shorten the prompt "
                            "(or start the server with a larger --max-model-len)", prompt_field)
    if requested is not None and requested > room:
        raise bad_request(f"this model's maximum context length is {max_model_len} tokens, but you requested "
                          f"{prompt_len + requested} tokens ({prompt_len} in the prompt + {requested} for the "
                          f"completion); shorten the prompt or set {field} to at most {room}", field)
    max_tokens = requested if requested is not None else min(default or room, room)
    if params.min_tokens > max_tokens:
        raise bad_request(f"min_tokens={params.min_tokens} is more than the {max_tokens} tokens this request may "
                          f"generate; lower min_tokens", "min_tokens")
    return max_tokens
