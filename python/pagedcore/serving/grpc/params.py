"""TGIS request parameters -> what the engine runs: SamplingParams plus the few things the gRPC
layer enforces itself (time limit, prompt truncation, which token details to return).

Every refusal is a ParamError that names the field by its path in the request
(`params.sampling.top_p`), the allowed values and the value sent: the INVALID_ARGUMENT message
tells the client what to change. TGIS's conventions hold: 0 means "unset / off" for every number.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from dataclasses import dataclass

from pagedcore.sampling_params import SamplingParams, StructuredOutputsParams

DEFAULT_MAX_NEW_TOKENS = 20    # TGIS's default when stopping.max_new_tokens is 0
MAX_NEW_TOKENS_LIMIT = 1024    # TGIS's default cap on max_new_tokens (server option)
MAX_TOP_N_TOKENS = 10          # vllm-tgis-adapter's cap (TGIS documents 5; a larger cap breaks no one)
MAX_STOP_SEQUENCES = 6         # TGIS's limits on stop sequences
MAX_STOP_SEQUENCE_BYTES = 240
MIN_TEMPERATURE = 0.05         # TGIS refuses smaller non-zero temperatures

GREEDY, SAMPLE = 0, 1          # fmaas.DecodingMethod
_TEXT_FORMAT, _JSON_FORMAT = 0, 1   # fmaas.DecodingParameters.ResponseFormat: no constraint, any JSON object


class ParamError(ValueError):
    """A request field the server refuses; str() is the whole client-facing message."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field} {message}")
        self.field = field


@dataclass(frozen=True)
class TokenDetail:
    """Which token lists and details to return (fmaas.ResponseOptions)."""

    input_text: bool = False
    generated_tokens: bool = False
    input_tokens: bool = False
    logprobs: bool = False
    ranks: bool = False
    top_n: int = 0

    @property
    def any_detail(self) -> bool:
        return self.logprobs or self.ranks or self.top_n > 0


@dataclass(frozen=True)
class GenerationPlan:
    """One fmaas.Parameters message, checked and translated; shared by every prompt of a batch."""

    sampling_params: SamplingParams   # max_tokens is the requested max_new_tokens; fit() caps it per prompt
    seed: int | None                  # reported back in GenerationResponse.seed (None for greedy)
    time_limit_s: float | None
    truncate_input_tokens: int        # 0 = keep the whole prompt
    detail: TokenDetail

    def fit(self, prompt_token_ids: list[int], max_model_len: int, field: str) -> FittedPrompt:
        """Truncates one prompt as asked and caps max_tokens to the room left in max_model_len."""
        ids = list(prompt_token_ids)
        if self.truncate_input_tokens and len(ids) > self.truncate_input_tokens:
            ids = ids[-self.truncate_input_tokens:]   # TGIS keeps the end of the prompt
        if not ids:
            raise ParamError(field, "is empty (no tokens); send a non-empty prompt")
        if len(ids) >= max_model_len:
            raise ParamError(field, f"has {len(ids)} tokens but max_model_len is {max_model_len}, which leaves no "
                                    f"room to generate; shorten it or set params.truncate_input_tokens "
                                    f"<= {max_model_len - 1}")
        params = self.sampling_params
        room = max_model_len - len(ids)
        if params.min_tokens > room:
            raise ParamError("params.stopping.min_new_tokens",
                             f"({params.min_tokens}) plus the {len(ids)} prompt tokens of {field} exceed "
                             f"max_model_len ({max_model_len}); ask for at most {room}")
        token_limited = params.max_tokens > room
        if token_limited:
            params = dataclasses.replace(params, max_tokens=room)
        return FittedPrompt(ids, params, token_limited)


@dataclass(frozen=True)
class FittedPrompt:
    token_ids: list[int]
    sampling_params: SamplingParams
    token_limited: bool   # max_tokens was cut to fit max_model_len: running out is TOKEN_LIMIT


def check_request(request, lora_enabled: bool = False) -> str | None:
    """The LoRA adapter a request names: adapter_id, or the deprecated prefix_id (vllm-tgis-adapter
    reads it as an adapter name too); None for the base model. Without LoRA (--enable-lora) either
    field is refused."""
    names = {name: getattr(request, name) for name in ("adapter_id", "prefix_id")
             if request.HasField(name) and getattr(request, name)}
    if names and not lora_enabled:
        name, value = next(iter(names.items()))
        raise ParamError(name, f"({value!r}) is not supported: this server serves no LoRA adapters; start it "
                               "with --enable-lora --lora-modules NAME=PATH, or leave it unset")
    if len(set(names.values())) > 1:
        raise ParamError("prefix_id", f"({names['prefix_id']!r}) differs from adapter_id ({names['adapter_id']!r}); "
                                      "prefix_id is the deprecated name of adapter_id: send only adapter_id")
    return next(iter(names.values()), None)


def plan_generation(params, *, max_new_tokens_limit: int = MAX_NEW_TOKENS_LIMIT,
                    default_include_stop_sequence: bool = True, max_logprobs: int = 20) -> GenerationPlan:
    """fmaas.Parameters -> GenerationPlan, or ParamError naming the first bad field."""
    sampling, stopping, decoding = params.sampling, params.stopping, params.decoding
    if params.method not in (GREEDY, SAMPLE):
        raise ParamError("params.method", f"must be GREEDY (0) or SAMPLE (1), got {params.method}")
    greedy = params.method == GREEDY

    # Sampling: checked under either method (a bad value is a client bug), applied only under SAMPLE.
    temperature = sampling.temperature if sampling.HasField("temperature") else 1.0
    _finite("params.sampling.temperature", temperature)
    if temperature < 0 or 0 < temperature < MIN_TEMPERATURE:
        raise ParamError("params.sampling.temperature",
                         f"must be 0 (greedy) or >= {MIN_TEMPERATURE}, got {temperature:g}")
    top_p = _finite("params.sampling.top_p", sampling.top_p)
    if not 0 <= top_p <= 1:
        raise ParamError("params.sampling.top_p", f"must be in (0, 1] (0 = off), got {top_p:g}")
    typical_p = _finite("params.sampling.typical_p", sampling.typical_p)
    if not 0 <= typical_p <= 1:
        raise ParamError("params.sampling.typical_p", f"must be in [0, 1] (0 or 1 = off), got {typical_p:g}")
    if not greedy and 0 < typical_p < 1:
        raise ParamError("params.sampling.typical_p", f"({typical_p:g}): typical sampling is not supported by "
                                                      "this server; leave it 0 and use top_p or top_k")
    seed = None
    if not greedy:
        # TGIS reports the seed a sampled request used; drawing one here makes every answer replayable.
        seed = sampling.seed if sampling.HasField("seed") else secrets.randbits(63)

    # Stopping.
    max_new_tokens = stopping.max_new_tokens or min(DEFAULT_MAX_NEW_TOKENS, max_new_tokens_limit)
    if max_new_tokens > max_new_tokens_limit:
        raise ParamError("params.stopping.max_new_tokens",
                         f"must be <= {max_new_tokens_limit} (this server's limit), got {max_new_tokens}")
    if stopping.min_new_tokens > max_new_tokens:
        raise ParamError("params.stopping.min_new_tokens",
                         f"must be <= max_new_tokens ({max_new_tokens}), got {stopping.min_new_tokens}")
    stops = list(stopping.stop_sequences)
    if len(stops) > MAX_STOP_SEQUENCES or not all(0 < len(s.encode()) <= MAX_STOP_SEQUENCE_BYTES for s in stops):
        raise ParamError("params.stopping.stop_sequences",
                         f"must hold at most {MAX_STOP_SEQUENCES} non-empty sequences of at most "
                         f"{MAX_STOP_SEQUENCE_BYTES} UTF-8 bytes each, got {len(stops)} "
                         f"(lengths {[len(s.encode()) for s in stops]})")
    include_stop = (stopping.include_stop_sequence if stopping.HasField("include_stop_sequence")
                    else default_include_stop_sequence)
    time_limit_s = stopping.time_limit_millis / 1000 if stopping.time_limit_millis else None

    # Decoding.
    repetition_penalty = _finite("params.decoding.repetition_penalty", decoding.repetition_penalty)
    if not 0 <= repetition_penalty <= 2:
        raise ParamError("params.decoding.repetition_penalty",
                         f"must be in (0, 2] (0 = off), got {repetition_penalty:g}")
    if decoding.HasField("length_penalty"):
        raise ParamError("params.decoding.length_penalty",
                         "is not supported by this server; leave it unset (max_new_tokens bounds the length)")
    structured_outputs = _constraint(decoding)

    detail = _token_detail(params.response, max_logprobs)
    try:
        sampling_params = SamplingParams(
            temperature=0.0 if greedy else temperature,
            top_k=0 if greedy else sampling.top_k,
            top_p=1.0 if greedy or top_p == 0 else top_p,
            seed=seed,
            repetition_penalty=repetition_penalty or 1.0,
            stop=stops or None,
            include_stop_str_in_output=include_stop,
            max_tokens=max_new_tokens,
            min_tokens=stopping.min_new_tokens,
            # The sampled token's logprob and rank come with any logprobs request; top_n adds candidates.
            logprobs=detail.top_n if detail.generated_tokens and detail.any_detail else None,
            prompt_logprobs=detail.top_n if detail.input_tokens and detail.any_detail else None,
            structured_outputs=structured_outputs,
        )
    except ValueError as error:   # a combination the checks above let through
        raise ParamError("params", f"are invalid: {error}") from None
    return GenerationPlan(sampling_params, seed, time_limit_s, params.truncate_input_tokens, detail)


def constraint_field(constraint: StructuredOutputsParams) -> str:
    """The request field a constraint came from (what INVALID_ARGUMENT names when it fails to compile)."""
    name = {"json": "json_schema", "json_object": "format"}.get(constraint.kind, constraint.kind)
    return f"params.decoding.{name}"


def _constraint(decoding) -> StructuredOutputsParams | None:
    """The guided-decoding oneof (vllm-tgis-adapter's fields) -> the constraint, None for free text."""
    guided = decoding.WhichOneof("guided")
    if guided is None or (guided == "format" and decoding.format == _TEXT_FORMAT):
        return None
    field = f"params.decoding.{guided}"
    if guided == "format":
        if decoding.format != _JSON_FORMAT:
            raise ParamError(field, f"must be TEXT (0) or JSON (1), got {decoding.format}")
        kwargs = {"json_object": True}
    elif guided == "json_schema":
        kwargs = {"json": decoding.json_schema}
    elif guided == "choice":
        kwargs = {"choice": list(decoding.choice.choices)}
    else:   # regex, grammar
        kwargs = {guided: getattr(decoding, guided)}
    try:
        return StructuredOutputsParams(**kwargs)
    except ValueError as error:
        message = str(error).replace("StructuredOutputsParams.", "").replace("StructuredOutputsParams", "it")
        raise ParamError(field, f"is invalid: {message}") from None


def _token_detail(response, max_logprobs: int) -> TokenDetail:
    detail = TokenDetail(input_text=response.input_text, generated_tokens=response.generated_tokens,
                         input_tokens=response.input_tokens, logprobs=response.token_logprobs,
                         ranks=response.token_ranks, top_n=response.top_n_tokens)
    limit = min(MAX_TOP_N_TOKENS, max_logprobs)
    if detail.top_n > limit:
        raise ParamError("params.response.top_n_tokens", f"must be <= {limit}, got {detail.top_n}")
    if detail.any_detail and not (detail.generated_tokens or detail.input_tokens):
        raise ParamError("params.response", "asks for token_logprobs, token_ranks or top_n_tokens without a token "
                                            "list to attach them to; also set generated_tokens and/or input_tokens")
    return detail


def _finite(field: str, value: float) -> float:
    if not math.isfinite(value):
        raise ParamError(field, f"must be a finite number, got {value}")
    return value


__all__ = ["ParamError", "GenerationPlan", "FittedPrompt", "TokenDetail", "check_request", "plan_generation",
           "constraint_field",
           "DEFAULT_MAX_NEW_TOKENS", "MAX_NEW_TOKENS_LIMIT", "MAX_TOP_N_TOKENS"]
