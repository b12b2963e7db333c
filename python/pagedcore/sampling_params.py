"""Per-request generation settings: `SamplingParams` (vLLM's names and meanings), the constraint of
structured output (`StructuredOutputsParams`) and `BeamSearchParams`.

Both are validated at construction: a bad value raises ValueError naming the field, the value and
the allowed range, so the HTTP layer can hand the message straight back to the client.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass

logger = logging.getLogger(__name__)

# Below this a temperature divides logits into float32 overflow (inf/nan); vLLM clamps to the same value.
MIN_TEMPERATURE = 1e-2
# torch.Generator.manual_seed accepts exactly this range.
_SEED_MIN, _SEED_MAX = -(2**63), 2**64 - 1
# OpenAI's documented range for logit_bias values.
_LOGIT_BIAS_LIMIT = 100.0


def _fail(name: str, value, allowed: str):
    raise ValueError(f"SamplingParams.{name} must be {allowed}, got {value!r}")


def _check_int(owner: str, name: str, value, lo: int | None = None, hi: int | None = None, allowed: str = ""):
    # bool is an int subclass; True as "n" is almost always a bug upstream, so refuse it.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{owner}.{name} must be an integer {allowed}, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ValueError(f"{owner}.{name} must be {allowed}, got {value!r}")


def _check_float(owner: str, name: str, value, ok, allowed: str):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok(value):
        raise ValueError(f"{owner}.{name} must be {allowed}, got {value!r}")


def _check_bool(owner: str, name: str, value):
    if not isinstance(value, bool):
        raise ValueError(f"{owner}.{name} must be True or False, got {value!r}")


# The constraint kinds of StructuredOutputsParams, in the order messages list them.
CONSTRAINT_KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass(frozen=True)
class StructuredOutputsParams:
    """One constraint on the generated text (vLLM's names): exactly one of
    json (a JSON schema, dict or JSON text), regex (the whole output matches it), choice (the output is
    one of these strings), grammar (EBNF / GBNF, root rule `root`), json_object (any JSON object).
    Frozen: `key` names the compiled grammar in the engine's cache."""

    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False  # JSON without free whitespace between tokens (compact)
    disable_fallback: bool = False        # there is one backend (xgrammar), so never a fallback

    def __post_init__(self):
        set_kinds = [k for k in CONSTRAINT_KINDS if getattr(self, k) not in (None, False)]
        if len(set_kinds) != 1:
            got = ", ".join(set_kinds) if set_kinds else "none"
            raise ValueError(f"StructuredOutputsParams needs exactly one of {', '.join(CONSTRAINT_KINDS)}; "
                             f"got {got}")
        if self.json is not None:
            if isinstance(self.json, str):
                try:
                    schema = json.loads(self.json)
                except ValueError as error:
                    raise ValueError(f"StructuredOutputsParams.json is not valid JSON ({error})") from None
            else:
                schema = self.json
            if not isinstance(schema, dict):
                raise ValueError("StructuredOutputsParams.json must be a JSON schema (an object), got "
                                 f"{type(schema).__name__}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"StructuredOutputsParams.{name} must be a non-empty string, got {value!r}")
        if self.choice is not None:
            if (not isinstance(self.choice, (list, tuple)) or not self.choice
                    or not all(isinstance(c, str) and c for c in self.choice)):
                raise ValueError("StructuredOutputsParams.choice must be a non-empty list of non-empty strings, "
                                 f"got {self.choice!r}")
            object.__setattr__(self, "choice", tuple(self.choice))
        if self.json_object is not None:
            _check_bool("StructuredOutputsParams", "json_object", self.json_object)
        for name in ("disable_any_whitespace", "disable_fallback"):
            _check_bool("StructuredOutputsParams", name, getattr(self, name))

    @property
    def kind(self) -> str:
        return next(k for k in CONSTRAINT_KINDS if getattr(self, k) not in (None, False))

    @property
    def key(self) -> tuple:
        """What the compiled grammar depends on: the cache key."""
        kind = self.kind
        value = getattr(self, kind)
        if kind == "json" and not isinstance(value, str):
            value = json.dumps(value, sort_keys=True)
        return kind, value, self.disable_any_whitespace


@dataclass
class SamplingParams:
    """How to pick the tokens of one request. Defaults are vLLM's."""

    n: int = 1  # independent samples for this prompt (the engine forks n rows)
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus: smallest top set with mass >= top_p; 1 = off
    top_k: int = 0  # keep the k most likely tokens; 0 or -1 = off (stored as 0)
    min_p: float = 0.0  # drop tokens with prob < min_p * max prob; 0 = off
    seed: int | None = None  # this request draws its noise from its own generator
    presence_penalty: float = 0.0  # OpenAI: minus this once for each token already generated
    frequency_penalty: float = 0.0  # OpenAI: minus this per occurrence in the generated tokens
    repetition_penalty: float = 1.0  # HF: divide (>0) / multiply (<0) logits of tokens in prompt or output
    stop: str | list[str] | None = None  # stored as a list
    stop_token_ids: list[int] | None = None  # stored as a list
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16  # None = until the model's max length
    min_tokens: int = 0  # EOS and stop_token_ids are masked until this many tokens exist
    logprobs: int | None = None  # top-N logprobs per sampled position (plus the sampled token); None = off
    prompt_logprobs: int | None = None  # the same for each prompt position; -1 = whole vocabulary; None = off
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    detokenize: bool = True
    # A constraint on the output (JSON schema, regex, choice, grammar); None = free text.
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self):
        _check_int("SamplingParams", "n", self.n, lo=1, allowed=">= 1")
        _check_float("SamplingParams", "temperature", self.temperature, lambda v: v >= 0, "a finite float >= 0 (0 = greedy)")
        if 0 < self.temperature < MIN_TEMPERATURE:
            logger.warning(
                "temperature %s is below %s and would overflow float32 logits; using %s",
                self.temperature, MIN_TEMPERATURE, MIN_TEMPERATURE,
            )
            self.temperature = MIN_TEMPERATURE
        _check_float("SamplingParams", "top_p", self.top_p, lambda v: 0 < v <= 1, "in (0, 1] (1 = off)")
        _check_int("SamplingParams", "top_k", self.top_k, lo=-1, allowed="0 or -1 (off) or >= 1")
        if self.top_k == -1:
            self.top_k = 0  # one spelling of "off" downstream
        _check_float("SamplingParams", "min_p", self.min_p, lambda v: 0 <= v <= 1, "in [0, 1] (0 = off)")
        if self.seed is not None:
            _check_int("SamplingParams", "seed", self.seed, lo=_SEED_MIN, hi=_SEED_MAX,
                       allowed=f"None or in [{_SEED_MIN}, {_SEED_MAX}]")
        for name in ("presence_penalty", "frequency_penalty"):
            _check_float("SamplingParams", name, getattr(self, name), lambda v: -2 <= v <= 2, "in [-2, 2] (0 = off)")
        _check_float("SamplingParams", "repetition_penalty", self.repetition_penalty, lambda v: v > 0, "> 0 (1 = off)")
        self._normalize_stop()
        for name in ("include_stop_str_in_output", "ignore_eos", "skip_special_tokens",
                     "spaces_between_special_tokens", "detokenize"):
            _check_bool("SamplingParams", name, getattr(self, name))
        if self.max_tokens is not None:
            _check_int("SamplingParams", "max_tokens", self.max_tokens, lo=1, allowed="None or >= 1")
        _check_int("SamplingParams", "min_tokens", self.min_tokens, lo=0, allowed=">= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            _fail("min_tokens", self.min_tokens, f"<= max_tokens ({self.max_tokens})")
        if self.logprobs is not None:
            _check_int("SamplingParams", "logprobs", self.logprobs, lo=0, allowed="None (off) or >= 0")
        if self.prompt_logprobs is not None:   # vLLM's -1: the whole vocabulary (the engine resolves it)
            _check_int("SamplingParams", "prompt_logprobs", self.prompt_logprobs, lo=-1,
                       allowed="None (off), >= 0, or -1 (the whole vocabulary)")
        self._normalize_logit_bias()
        if self.stop and not self.detokenize:
            _fail("stop", self.stop, "empty when detokenize=False (stop strings are matched on the text)")
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            _fail("structured_outputs", self.structured_outputs, "None or a StructuredOutputsParams")

    def _normalize_stop(self):
        stop = self.stop
        if stop is None:
            stop = []
        elif isinstance(stop, str):
            stop = [stop]
        elif isinstance(stop, (list, tuple)):
            stop = list(stop)
        else:
            _fail("stop", stop, "None, a string or a list of strings")
        for s in stop:
            if not isinstance(s, str) or not s:
                _fail("stop", self.stop, "None, a non-empty string or a list of non-empty strings")
        self.stop = stop

        ids = self.stop_token_ids
        if ids is None:
            ids = []
        elif isinstance(ids, (list, tuple)):
            ids = list(ids)
        else:
            _fail("stop_token_ids", ids, "None or a list of token ids >= 0")
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                _fail("stop_token_ids", self.stop_token_ids, "None or a list of token ids >= 0")
        self.stop_token_ids = ids

    def _normalize_logit_bias(self):
        bias = self.logit_bias
        if bias is None:
            return
        if not isinstance(bias, dict):
            _fail("logit_bias", bias, "None or a dict of token id -> bias")
        clean = {}
        for token_id, value in bias.items():
            if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
                _fail("logit_bias", bias, "a dict whose keys are token ids >= 0")
            if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                    or abs(value) > _LOGIT_BIAS_LIMIT):
                _fail("logit_bias", bias, f"a dict whose values are in [-{_LOGIT_BIAS_LIMIT:g}, {_LOGIT_BIAS_LIMIT:g}]")
            clean[token_id] = float(value)
        self.logit_bias = clean or None

    # Derived views the sampler reads; computed on access so a field changed after construction
    # (the engine fills max_tokens from max_model_len) never leaves a stale copy behind.
    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @property
    def has_truncation(self) -> bool:
        return self.top_k > 0 or self.top_p < 1 or self.min_p > 0

    def child_params(self, index: int) -> SamplingParams:
        """Params for the index-th of n forked samples: n=1, and a distinct seed so seeded children
        differ from each other yet stay reproducible (vLLM gives child i the seed `seed + i`)."""
        seed = None if self.seed is None else (self.seed + index) % (_SEED_MAX + 1)
        return dataclasses.replace(self, n=1, seed=seed)


@dataclass
class BeamSearchParams:
    """Beam search settings, as vLLM takes them today (the search itself is the engine's)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0  # score = cumulative logprob / generated length ** length_penalty (HF's)
    include_stop_str_in_output: bool = False
    # HF's generate(early_stopping=...): False (stop when no running beam can win, at its current
    # length), True (stop once beam_width hypotheses ended), "never" (the canonical test).
    early_stopping: bool | str = False

    def __post_init__(self):
        _check_int("BeamSearchParams", "beam_width", self.beam_width, lo=1, allowed=">= 1")
        _check_int("BeamSearchParams", "max_tokens", self.max_tokens, lo=1, allowed=">= 1")
        _check_bool("BeamSearchParams", "ignore_eos", self.ignore_eos)
        _check_bool("BeamSearchParams", "include_stop_str_in_output", self.include_stop_str_in_output)
        _check_float("BeamSearchParams", "temperature", self.temperature, lambda v: v >= 0, "a finite float >= 0")
        _check_float("BeamSearchParams", "length_penalty", self.length_penalty, lambda v: True, "a finite float")
        if not (isinstance(self.early_stopping, bool) or self.early_stopping == "never"):
            raise ValueError(f"BeamSearchParams.early_stopping must be True, False or \"never\", "
                             f"got {self.early_stopping!r}")


__all__ = ["SamplingParams", "StructuredOutputsParams", "BeamSearchParams", "MIN_TEMPERATURE"]
