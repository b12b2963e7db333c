"""`SpeculativeConfig`: which proposer drafts tokens and how many, vLLM's field names.

Given as a dict (`LLM(speculative_config={...})`, `--speculative-config '{"method": "ngram", ...}'`)
and validated here, at start-up, so that a bad value is refused before any model loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

METHODS = ("ngram",)
# Named so that asking for them gets a clear answer rather than "unknown method".
NOT_IMPLEMENTED = ("draft_model", "layer_skip", "eagle", "eagle3", "medusa", "mlp_speculator", "mtp")
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

    def check_against(self, max_num_batched_tokens: int) -> None:
        """K drafts are verified in one chunk of K + 1 tokens: it must fit one step's budget."""
        if self.num_speculative_tokens + 1 > max_num_batched_tokens:
            raise ValueError(
                f"speculative_config.num_speculative_tokens ({self.num_speculative_tokens}) + 1 exceeds "
                f"max_num_batched_tokens ({max_num_batched_tokens}); lower it or raise --max-num-batched-tokens")
