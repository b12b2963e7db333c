"""EngineView: what front ends, benchmarks and the trace recorder may read of an LLMEngine.

Fixed facts about the model and the setup, and live counts; nothing here changes the engine. Read
live values on the thread that drives the engine (the async engine publishes snapshots for others).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from pagedcore import _core
    from pagedcore.config import EngineConfig
    from pagedcore.engine.llm_engine import LLMEngine
    from pagedcore.model_config import ModelConfig

# listener(scheduler_output, update_result, timing) after every step (the trace recorder, probes).
StepListener = Callable[[Any, Any, dict], None]


class EngineView:
    def __init__(self, engine: LLMEngine):
        self._engine = engine

    # -- fixed after construction ------------------------------------------------------------------
    @property
    def config(self) -> EngineConfig:
        return self._engine.config

    @property
    def model_config(self) -> ModelConfig:
        return self._engine.model_config

    @property
    def tokenizer(self):
        return self._engine.tokenizer

    @property
    def model_path(self) -> str | None:
        return getattr(self._engine.loaded.source, "path", None)

    @property
    def model_format(self) -> str | None:
        return getattr(self._engine.loaded.source, "format", None)

    @property
    def chat_template(self) -> str | None:
        """The model's own template (None if it has none; the tokenizer's may still exist)."""
        return self._engine.loaded.chat_template

    @property
    def generation_config(self) -> dict:
        return dict(self._engine.loaded.generation_config or {})

    @property
    def load_seconds(self) -> dict[str, float]:
        return dict(getattr(self._engine.loaded, "load_seconds", {}) or {})

    @property
    def num_parameters(self) -> int:
        worker = self._engine.worker
        if hasattr(worker, "num_parameters"):   # an Executor: summed over its ranks' shards
            return worker.num_parameters
        return sum(p.numel() for p in worker.model.parameters())

    @property
    def startup_seconds(self) -> float:
        return self._engine.startup_seconds

    @property
    def kv_cache_description(self) -> str:
        return self._engine.kv_cache_description

    @property
    def kv_cache_bytes_per_block(self) -> int:
        return self._engine.kv_cache_spec.bytes_per_block

    @property
    def kv_cache_bytes(self) -> int:
        return self._engine.worker.memory_report().kv_cache_bytes

    def memory_report(self):
        """Bytes held (engine/worker.py MemoryReport): the target's, and a draft model's next to them."""
        return self._engine.memory_report()

    @property
    def model(self) -> torch.nn.Module:
        """The in-process model, for instrumentation only (benchmark probes hook its forward)."""
        return self._engine.worker.model

    # -- live --------------------------------------------------------------------------------------
    @property
    def num_unfinished_requests(self) -> int:
        return self._engine.num_unfinished_requests

    def request_ids(self) -> list[str]:
        return self._engine.registry.request_ids()

    def scheduler_stats(self) -> _core.SchedulerStats:
        return self._engine.scheduler.stats()

    @property
    def last_step_timing(self) -> dict | None:
        return self._engine.last_step_timing

    def request_of_seq(self, seq_id: int) -> tuple[str, float] | None:
        """(request id, arrival time) of a live sequence, None once it has ended."""
        seq = self._engine.registry.get_seq(seq_id)
        return None if seq is None else (seq.request.request_id, seq.request.metrics.arrival_time)

    @property
    def scheduler(self) -> _core.Scheduler:
        """For inspection only (the step tracer reads queues, pools and trace events): adding,
        aborting or stepping through it would desynchronise the engine."""
        return self._engine.scheduler

    # -- observers ---------------------------------------------------------------------------------
    def add_step_listener(self, listener: StepListener) -> None:
        self._engine.step_listeners.append(listener)

    def remove_step_listener(self, listener: StepListener) -> None:
        self._engine.step_listeners.remove(listener)
