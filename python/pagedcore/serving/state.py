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
    cors: Any = None                          # transport_args.CorsConfig from --allowed-origins; None: no CORS
    engine: AsyncLLMEngine | None = None      # None while the model loads
    draining: bool = False
    metrics: Any = None                       # ServerMetrics, once the model is loaded
    lora_modules: list = field(default_factory=list)  # LoRARequests of --lora-modules, loaded at attach()
    lora_manager: Any = None                  # the engine's pagedcore.lora.LoRAManager with --enable-lora
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
        self.lora_manager = engine.engine.lora_manager
        if self.lora_modules and self.lora_manager is None:
            raise ValueError("--lora-modules needs --enable-lora")
        for lora_request in self.lora_modules:  # before the first request: a bad adapter stops the start
            self.lora_manager.add_adapter(lora_request)
        grammars = engine.engine.grammars
        if self.constraint_limits is not None:
            grammars.limits = self.constraint_limits
        if self.metrics is not None:
            self.metrics.watch_grammars(grammars)
            if self.lora_manager is not None:
                self.metrics.watch_lora(self.lora_manager)
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

    def response_model_name(self, requested: str | None) -> str:
        """The `model` a response reports: a LoRA adapter's name when one was asked for, else the served name."""
        if requested and self.lora_manager is not None and requested in self.lora_manager.known:
            return requested
        return self.model_name

    def check_model(self, name: str | None):
        """None or "" means the default (first served) model, as vLLM treats an empty `model`.
        Returns the LoRARequest when `name` is a loaded LoRA adapter (docs/lora.md), else None."""
        if name and name not in self.served_model_names:
            if self.lora_manager is not None and name in self.lora_manager.known:
                return self.lora_manager.known[name]
            served = ", ".join(repr(n) for n in self.served_model_names)
            if self.lora_manager is not None:
                served += "; LoRA adapters: " + (", ".join(repr(n) for n in sorted(self.lora_manager.known)) or "none")
            raise APIError(404, f"the model {name!r} does not exist on this server; it serves {served} "
                                "(GET /v1/models lists them)", param="model", code="model_not_found")
        return None

