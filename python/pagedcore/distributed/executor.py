"""Executor: the engine's Worker when the model runs in ranks (worker processes or Ray actors).

To LLMEngine it is one Worker (engine/worker.py: a StepInput in, fp32 logits [rows, vocab] out);
behind it, tp x pp ranks each hold a shard. On top of the Worker calls it adds shutdown() (stop and
reap every rank, release shared memory) and check_health() (raises WorkerDiedError when a rank is
gone). Backends: mp_executor.py (local processes, the default), ray_executor.py (Ray actors).
"""

from __future__ import annotations

from abc import abstractmethod

import torch

from pagedcore.config import EngineConfig
from pagedcore.distributed.parallel_config import executor_backend, parallel_layout
from pagedcore.engine import kv_cache as kvc
from pagedcore.engine.worker import MemoryProfile, MemoryReport, Worker
from pagedcore.model_config import ModelConfig


class Executor(Worker):
    """A Worker whose model lives in other processes. execute_step raises WorkerDiedError (naming the
    rank, its pid and how it ended) when a rank dies; the engine is unusable from then on."""

    num_parameters: int = 0   # summed over the ranks' shards (replicated norms and KV heads count once per rank)

    def __init__(self, config: EngineConfig, model_config: ModelConfig):
        self.config = config
        self.model_config = model_config
        self.layout = parallel_layout(config)

    @property
    def model(self) -> torch.nn.Module:
        raise AttributeError("the model runs in worker ranks (--tensor-parallel-size / --pipeline-parallel-size "
                             "> 1); there is no in-process model to instrument")

    def profile_memory(self, spec: kvc.KVCacheSpec, shape: kvc.ProfileShape) -> MemoryProfile:
        raise ValueError("memory profiling measures a CUDA device; the ranks of this executor run on the CPU")

    def memory_report(self) -> MemoryReport:
        reports = self.rank_memory_reports()
        return MemoryReport(weight_bytes=sum(r["weight_bytes"] for r in reports),
                            kv_cache_bytes=sum(r["kv_cache_bytes"] for r in reports),
                            swap_bytes=sum(r["swap_bytes"] for r in reports))

    @abstractmethod
    def rank_memory_reports(self) -> list[dict]:
        """Per rank: weight_bytes, kv_cache_bytes, swap_bytes, num_parameters."""

    @abstractmethod
    def check_health(self) -> None:
        """Raises WorkerDiedError if any rank is gone."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stops every rank (waits a few seconds, then kills), releases channels and shared memory.
        Idempotent; safe after a rank died."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def make_executor(config: EngineConfig, model_config: ModelConfig) -> Executor:
    """The executor the config names (--distributed-executor-backend; mp by default). Spawns the ranks;
    call load_model and init_kv_cache next, as with any Worker. config.dtype must still be as the user
    gave it (the ranks' loaders read it: "auto" keeps a GGUF's blocks)."""
    backend = executor_backend(config) or "mp"
    if backend == "ray":
        from pagedcore.distributed.ray_executor import RayExecutor

        return RayExecutor(config, model_config)
    from pagedcore.distributed.mp_executor import MPExecutor

    return MPExecutor(config, model_config)
