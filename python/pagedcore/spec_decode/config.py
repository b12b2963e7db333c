"""`SpeculativeConfig`: which proposer drafts tokens and how many, vLLM's field names.

Given as a dict (`LLM(speculative_config={...})`, `--speculative-config '{"method": "ngram", ...}'`)
and validated here, at start-up, so that a bad value is refused before any model loads. Methods:

    ngram        prompt lookup (prompt_lookup_min / prompt_lookup_max)
    draft_model  a second, smaller model with the target's vocabulary ("model": its HF folder or GGUF);
                 vLLM's older spelling, {"model": PATH} without "method", means the same
    layer_skip   self-speculation: the target's first "num_layers" layers + its final norm and LM head
                 (pagedcore's own method; vLLM has none)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

METHODS = ("ngram", "draft_model", "layer_skip")
DRAFT_METHODS = ("draft_model", "layer_skip")   # a model forward proposes (spec_decode/draft_proposer.py)
# Named so that asking for them gets a clear answer rather than "unknown method".
NOT_IMPLEMENTED = ("eagle", "eagle3", "medusa", "mlp_speculator", "mtp")
# vLLM's older way to ask for prompt lookup: the draft "model" named "[ngram]".
_NGRAM_MODEL_NAMES = ("ngram", "[ngram]")
DRAFT_DTYPES = ("auto", "float32", "bfloat16")   # draft_model's "dtype" (pagedcore's own field)
MAX_SPECULATIVE_TOKENS = 16   # more drafts than this never pays with an n-gram proposer


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "ngram"
    num_speculative_tokens: int = 4      # K: drafts proposed per sequence per step
    prompt_lookup_min: int = 1           # shortest suffix n-gram looked up in the token history
    prompt_lookup_max: int = 4           # longest suffix n-gram looked up (the longest match wins)
    # Steps (not requests) with more unfinished requests than this propose nothing: a large batch is
    # compute-bound, so verifying drafts there costs more than it saves. None = always propose.
    disable_by_batch_size: int | None = 8
    # Per sequence: after this many verifications in a row with no draft accepted, stop proposing for
    # a while (2, 4, 8 ... up to 64 of its steps), so sequences that do not copy their context pay
    # nothing. 0 = never back off.
    backoff_after_misses: int = 2
    # draft_model: the draft's HF folder or .gguf file (vLLM's field) and its weight format (None,
    # "gguf", "int8_per_channel": as --quantization). A .gguf draft runs as stored (its quantized
    # blocks, fp32 activations), as vLLM runs a GGUF draft; an HF folder in the engine's --dtype.
    model: str | None = None
    quantization: str | None = None
    # draft_model, pagedcore's own field: "auto" (as above) or "float32" / "bfloat16": the draft's
    # weights and activations in that dtype (a .gguf draft dequantised to it).
    dtype: str = "auto"
    # layer_skip: how many of the target's first layers the draft runs (1 <= num_layers < the target's).
    num_layers: int | None = None

    @classmethod
    def from_value(cls, value) -> SpeculativeConfig | None:
        """A dict, a JSON string, a SpeculativeConfig or None -> a validated config (or None)."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"speculative_config is not valid JSON ({e}); give e.g. "
                                 '\'{"method": "ngram", "num_speculative_tokens": 4}\'') from None
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a dict (or JSON object), got {type(value).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"speculative_config has unknown field(s) {unknown}; known fields: {sorted(known)}")
        if "method" not in value and value.get("model") is not None:   # vLLM's older spelling
            model = value["model"]
            value = {**value, "method": "ngram" if model in _NGRAM_MODEL_NAMES else "draft_model"}
            if value["method"] == "ngram":
                value.pop("model")
        if "method" not in value:
            raise ValueError('speculative_config needs "method" (supported: ' + ", ".join(METHODS) + ")")
        return cls(**value)

    def __post_init__(self):
        def fail(name, allowed):
            raise ValueError(f"speculative_config.{name} must be {allowed}, got {getattr(self, name)!r}")

        if self.method in NOT_IMPLEMENTED:
            raise ValueError(f"speculative_config.method {self.method!r} is not implemented in pagedcore yet; "
                             f"use one of: {', '.join(METHODS)}")
        if self.method not in METHODS:
            fail("method", "one of " + ", ".join(repr(m) for m in METHODS))

        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)

        k = self.num_speculative_tokens
        if not is_int(k) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            fail("num_speculative_tokens", f"an integer in [1, {MAX_SPECULATIVE_TOKENS}]")
        if not is_int(self.prompt_lookup_min) or self.prompt_lookup_min < 1:
            fail("prompt_lookup_min", "an integer >= 1")
        if not is_int(self.prompt_lookup_max) or self.prompt_lookup_max < self.prompt_lookup_min:
            fail("prompt_lookup_max", f"an integer >= prompt_lookup_min ({self.prompt_lookup_min})")
        if self.disable_by_batch_size is not None and (not is_int(self.disable_by_batch_size)
                                                       or self.disable_by_batch_size < 1):
            fail("disable_by_batch_size", "None or an integer >= 1")
        if not is_int(self.backoff_after_misses) or self.backoff_after_misses < 0:
            fail("backoff_after_misses", "an integer >= 0")
        if self.method == "draft_model":
            if not isinstance(self.model, str) or not self.model:
                fail("model", 'the draft model\'s HF folder or .gguf file (method "draft_model")')
        elif self.model is not None:
            fail("model", f'None with method {self.method!r} (a draft "model" is for method "draft_model")')
        if self.quantization is not None and self.method != "draft_model":
            fail("quantization", 'None unless method is "draft_model" (the draft\'s weight format)')
        if self.dtype not in DRAFT_DTYPES:
            fail("dtype", "one of " + ", ".join(repr(d) for d in DRAFT_DTYPES) + " (the draft model's dtype)")
        if self.dtype != "auto" and self.method != "draft_model":
            fail("dtype", '"auto" unless method is "draft_model" (the draft model\'s dtype)')
        if self.dtype == "bfloat16" and self.quantization is not None:
            fail("dtype", f'"auto" or "float32" with quantization {self.quantization!r} (quantized weights run '
                 "float32 activations)")
        if self.method == "layer_skip":
            if not is_int(self.num_layers) or self.num_layers < 1:
                fail("num_layers", 'an integer >= 1, the target layers the draft runs (method "layer_skip")')
        elif self.num_layers is not None:
            fail("num_layers", 'None unless method is "layer_skip"')

    def check_against(self, max_num_batched_tokens: int) -> None:
        """K drafts are verified in one chunk of K + 1 tokens: it must fit one step's budget."""
        if self.num_speculative_tokens + 1 > max_num_batched_tokens:
            raise ValueError(
                f"speculative_config.num_speculative_tokens ({self.num_speculative_tokens}) + 1 exceeds "
                f"max_num_batched_tokens ({max_num_batched_tokens}); lower it or raise --max-num-batched-tokens")
