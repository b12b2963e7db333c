"""The D engine replicas of a data-parallel run (--data-parallel-size D), and how a request is keyed
for routing. Shared by the server's DPAsyncLLMEngine (dp_engine.py) and the offline DPLLMEngine
(dp_offline.py).

    front end (one process: HTTP, gRPC, D schedulers, D samplers)
      ├─ replica 0: LLMEngine ── Executor ──▶ rank process(es) on core slice 0
      └─ replica 1: LLMEngine ── Executor ──▶ rank process(es) on core slice 1

Each replica's model runs in its own worker process(es) (an Executor, even with tp = pp = 1), so the
D forwards compute in parallel while this process holds the schedulers. With the mp backend the
usable cores are cut into D contiguous slices; replica d is built on a thread pinned to slice d, and
the Executor's core plan (parallel_config.core_plan reads the calling thread's affinity) splits that
slice among the replica's own ranks.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Sequence

from pagedcore.config import EngineConfig
from pagedcore.distributed.parallel_config import core_plan, usable_cores

logger = logging.getLogger(__name__)


def replica_backend(config: EngineConfig) -> str:
    """Every replica runs its model in ranks: mp unless ray was asked for."""
    return config.distributed_executor_backend or "mp"


def replica_config(config: EngineConfig) -> EngineConfig:
    """One replica's config: the same engine, one replica, its model in an Executor."""
    return dataclasses.replace(config, data_parallel_size=1, distributed_executor_backend=replica_backend(config))


def check_dp_config(config: EngineConfig) -> None:
    """What a data-parallel run refuses before anything loads (ValueError naming the flag and fix)."""
    dp = config.data_parallel_size
    if dp == 1:
        return
    if config.enable_lora:
        raise ValueError(f"LoRA adapters (--enable-lora) are not served with --data-parallel-size > 1 (asked: "
                         f"{dp}): adapters are loaded per replica and the runtime load/unload routes reach one; "
                         "drop --enable-lora or use --data-parallel-size 1")
    if not str(config.device).startswith("cpu"):
        raise ValueError(f"--data-parallel-size > 1 runs CPU replicas in this build (asked --device {config.device}); "
                         "use --device cpu, or --data-parallel-size 1")
    if replica_backend(config) == "mp":
        world = config.tensor_parallel_size * config.pipeline_parallel_size
        cores = usable_cores()
        if dp * world > len(cores):
            raise ValueError(
                f"--data-parallel-size {dp} x {world} rank(s) per replica (--tensor-parallel-size x "
                f"--pipeline-parallel-size) need {dp * world} cores, but this process may use {len(cores)} "
                f"{list(cores)}; lower --data-parallel-size, or spread the replicas over machines with "
                "--distributed-executor-backend ray")


def replica_core_slices(num_replicas: int) -> list[tuple[int, ...]]:
    """Replica d's cores: the d-th of num_replicas contiguous slices of the usable cores."""
    return core_plan(num_replicas)


def load_replicas(config: EngineConfig) -> list:
    """D LLMEngines, built in parallel (each on its own thread, pinned to its core slice with mp). If
    any fails, the others are shut down (their ranks stopped) and the first error is raised."""
    from pagedcore.engine.llm_engine import LLMEngine

    check_dp_config(config)
    dp = config.data_parallel_size
    slices = replica_core_slices(dp) if replica_backend(config) == "mp" else [None] * dp
    # The model's metadata once on this thread first: transformers resolves its lazy attributes
    # (AutoTokenizer, ...) unsafely when two threads ask at once, as the replicas' loads would.
    from pagedcore.distributed.model_metadata import load_model_metadata

    load_model_metadata(config.model, dtype=config.dtype, quantization=config.quantization)
    engines: list = [None] * dp
    errors: list[BaseException | None] = [None] * dp

    def build(index: int) -> None:
        try:
            if slices[index] is not None:
                # This thread only (pid 0 = the calling thread): the executor it creates, and the rank
                # processes that executor spawns, inherit the slice.
                os.sched_setaffinity(0, slices[index])
            engines[index] = LLMEngine(replica_config(config))
        except BaseException as error:  # noqa: BLE001 - raised on the caller's thread below
            errors[index] = error

    threads = [threading.Thread(target=build, args=(d,), name=f"pagedcore-load-replica-{d}", daemon=True)
               for d in range(dp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = next((e for e in errors if e is not None), None)
    if failed is not None:
        for engine in engines:
            if engine is not None:
                engine.shutdown()
        raise failed
    # One grammar cache for all: a constraint compiles once, under the server's one set of limits.
    for engine in engines[1:]:
        engine.grammars = engines[0].grammars
    logger.info("%d data-parallel replicas ready (%s backend%s)", dp, replica_backend(config),
                "" if slices[0] is None else f", cores {[list(s) for s in slices]}")
    return engines


def routing_prompt(engine, prompt: str | None, prompt_token_ids: Sequence[int] | None, params,
                   lora_request) -> tuple[list[int] | None, list[int] | None, int]:
    """(prompt token ids to hand the replica, the ids to probe the caches with or None, adapter id).
    Tokenized here, as the engine would (add_special_tokens=True), when prefix caching can use it; a
    request salted off the cache (prompt logprobs) is probed with None: only load decides."""
    config = engine.config
    adapter_id = 0 if lora_request is None else int(lora_request.lora_int_id)
    if not config.enable_prefix_caching or getattr(params, "prompt_logprobs", None) is not None:
        return (None if prompt_token_ids is None else list(prompt_token_ids)), None, adapter_id
    if prompt_token_ids is None:
        if prompt is None:
            raise ValueError("give a prompt or prompt_token_ids")
        prompt_token_ids = engine.tokenizer.encode(prompt, add_special_tokens=True)
    ids = [int(t) for t in prompt_token_ids]
    return ids, ids, adapter_id
