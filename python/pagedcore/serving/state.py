"""ServerState: what every HTTP handler reads: the engine (None while loading), the model's fixed facts
(tokenizer, served names, lengths, chat template) and the server's limits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pagedcore.serving.async_engine import AsyncLLMEngine
from pagedcore.serving.openai.errors import APIError

# Fields of a model's generation_config.json that become request defaults, as vLLM does.
_GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass
class ServerState:
    served_model_names: list[str]
    max_request_body_bytes: int = 1 << 20
    api_keys: list[str] = field(default_factory=list)
    enable_auto_tool_choice: bool = False     # --enable-auto-tool-choice: tool_choice "auto" allowed
    tool_call_parser: str | None = None       # --tool-call-parser (hermes)
    constraint_limits: Any = None             # ConstraintLimits from --structured-outputs-*; None: defaults
    engine: AsyncLLMEngine | None = None      # None while the model loads
    draining: bool = False
    metrics: Any = None                       # ServerMetrics, once the model is loaded
    # Filled by attach() once the model is loaded; read-only afterwards.
    tokenizer: Any = None
    model_path: str | None = None
    max_model_len: int = 0
    vocab_size: int = 0
    max_logprobs: int = 0
    max_num_seqs: int = 0
    priority_scheduling: bool = False
    chat_template: str | None = None
    generation_defaults: dict[str, Any] = field(default_factory=dict)
    created: int = 0                          # unix time the model became ready (GET /v1/models)

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    def attach(self, engine: AsyncLLMEngine, chat_template: str | None, created: int) -> None:
        """Fills the model facts from a loaded engine; the server answers requests from now on.
        Reads only what never changes after construction, never the engine's live state."""
        view = engine.engine.view
        self.tokenizer = view.tokenizer
        self.model_path = view.model_path
        self.max_model_len = view.config.max_model_len
        self.vocab_size = view.model_config.vocab_size
        self.max_logprobs = view.config.max_logprobs
        self.max_num_seqs = view.config.max_num_seqs
        self.priority_scheduling = view.config.scheduling_policy == "priority"
        self.chat_template = chat_template or view.chat_template or getattr(view.tokenizer, "chat_template", None)
        self.generation_defaults = {k: v for k, v in view.generation_config.items()
                                    if k in _GENERATION_DEFAULTS and v is not None}
        self.created = created
        grammars = engine.engine.grammars
        if self.constraint_limits is not None:
            grammars.limits = self.constraint_limits
        if self.metrics is not None:
            self.metrics.watch_grammars(grammars)
        self.engine = engine

    @property
    def ready(self) -> bool:
        return self.engine is not None and not self.draining and self.engine.accepting

    def require_loaded(self) -> None:
        if self.engine is None:
            raise APIError(503, "the model is still loading; retry in a few seconds (GET /health turns 200 when ready)")

    def require_engine(self) -> AsyncLLMEngine:
        """The engine, or the 503 that tells the client why there is none to use."""
        self.require_loaded()
        if self.draining or not self.engine.accepting:
            if self.engine.error is not None:
                raise APIError(503, f"the engine stopped after an error: {self.engine.error}; restart the server")
            raise APIError(503, "the server is shutting down and accepts no new requests; retry against another replica")
        return self.engine

    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.served_model_names:
            served = ", ".join(repr(n) for n in self.served_model_names)
            raise APIError(404, f"the model {name!r} does not exist on this server; it serves {served} "
                                "(GET /v1/models lists them)", param="model", code="model_not_found")

