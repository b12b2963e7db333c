"""ConstraintLimits: what the engine will compile. A constraint is refused (ValueError offline, 400 /
INVALID_ARGUMENT on the servers, naming the field) when its text is too large or its compile overruns,
so that one client's schema never stalls or starves the others.

pagedcore's own bounds (vLLM has none): `pagedcore serve --structured-outputs-max-bytes` and
`--structured-outputs-compile-timeout` set them on a server; offline, `llm.llm_engine.grammars.limits`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pagedcore.sampling_params import StructuredOutputsParams

DEFAULT_MAX_BYTES = 128 << 10          # a large tool set (~60 tools) fits; a 3000-property schema does not
DEFAULT_COMPILE_TIMEOUT_S = 10.0       # real schemas compile in milliseconds to a second


@dataclass
class ConstraintLimits:
    max_bytes: int = DEFAULT_MAX_BYTES                 # UTF-8 bytes of the constraint's text
    compile_timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S

    def __post_init__(self):
        if not isinstance(self.max_bytes, int) or self.max_bytes < 1:
            raise ValueError(f"ConstraintLimits.max_bytes must be a positive number of bytes, got {self.max_bytes!r}")
        if not isinstance(self.compile_timeout_s, (int, float)) or not self.compile_timeout_s > 0:
            raise ValueError("ConstraintLimits.compile_timeout_s must be a positive number of seconds, got "
                             f"{self.compile_timeout_s!r}")


def constraint_bytes(constraint: StructuredOutputsParams) -> int:
    """The size of the constraint's text as the client sent it (a dict schema: its compact JSON)."""
    kind = constraint.kind
    value = getattr(constraint, kind)
    if kind == "json_object":
        return 0
    if kind == "choice":
        return sum(len(c.encode()) for c in value)
    if kind == "json" and not isinstance(value, str):
        value = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return len(value.encode())
