"""Start-up checks of a parallel run (before any weight loads) and the core-binding plan of its ranks.

Every check raises ValueError naming the flag to change and how: a bad combination must fail in a
second at start-up, not after minutes of loading shards, and never as a hang or a wrong answer.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from pagedcore.config import EngineConfig
from pagedcore.distributed.model_shard import check_shardable
from pagedcore.distributed.rank import ParallelLayout
from pagedcore.distributed.sharding import check_layout, kv_block_bytes
from pagedcore.model_config import ModelConfig

def parallel_layout(config: EngineConfig) -> ParallelLayout:
    return ParallelLayout(tp_size=config.tensor_parallel_size, pp_size=config.pipeline_parallel_size)


def executor_backend(config: EngineConfig) -> str | None:
    """'mp' or 'ray' when the model runs in ranks (tp * pp > 1, or a backend named explicitly), None
    when it runs in the engine's own process."""
    if config.distributed_executor_backend is not None:
        return config.distributed_executor_backend
    return "mp" if parallel_layout(config).world_size > 1 else None


def usable_cores() -> tuple[int, ...]:
    """The cores this process may run on (its affinity mask: taskset, cgroup cpusets), sorted."""
    return tuple(sorted(os.sched_getaffinity(0)))


def core_plan(world_size: int, cores: tuple[int, ...] | None = None) -> list[tuple[int, ...]]:
    """Rank r's cores: the r-th of world_size contiguous, near-equal slices of the usable cores (the
    first len(cores) % world_size ranks get one more). Contiguous, because neighbouring core ids
    share a cache level on most machines. Raises when a rank would get no core of its own."""
    cores = usable_cores() if cores is None else tuple(cores)
    if world_size > len(cores):
        raise ValueError(
            f"{world_size} model ranks (--tensor-parallel-size x --pipeline-parallel-size) need a core each, but "
            f"this process may use {len(cores)} core(s) {list(cores)}; lower --tensor-parallel-size / "
            "--pipeline-parallel-size, or use --distributed-executor-backend ray to spread ranks over machines")
    base, extra = divmod(len(cores), world_size)
    plan, start = [], 0
    for rank in range(world_size):
        n = base + (1 if rank < extra else 0)
        plan.append(cores[start:start + n])
        start += n
    return plan


def check_parallel_config(config: EngineConfig, model_config: ModelConfig) -> None:
    """Everything about a tp x pp run that can be refused from the config alone, before any weight
    loads (config.dtype as the user gave it: "auto" on a GGUF keeps quantized blocks)."""
    layout = parallel_layout(config)
    backend = executor_backend(config)
    if backend is None:
        return
    tp, pp = layout.tp_size, layout.pp_size
    check_layout(model_config, layout)     # heads, KV heads, intermediate, vocabulary vs tp; layers vs pp
    check_shardable(config.model, config.dtype, config.quantization, tp)   # quantized formats with tp > 1
    if config.enable_lora:
        raise ValueError("LoRA adapters (--enable-lora) do not run with --tensor-parallel-size / "
                         f"--pipeline-parallel-size > 1 (asked: {tp} x {pp}); drop one of them")
    spec = config.speculative_config
    if spec is not None and getattr(spec, "method", None) in ("draft_model", "layer_skip"):
        # Refused here, before the ranks load the target: the draft runs in the engine process today.
        raise ValueError(f'speculative_config method "{spec.method}" runs its draft in the engine process and '
                         "does not run with worker ranks (--tensor-parallel-size / --pipeline-parallel-size > 1 or "
                         '--distributed-executor-backend); use "ngram" speculation there, or one process')
    if torch.device(config.device).type == "cuda":
        # One GPU per rank, NCCL between a stage's ranks (mp only: Ray actors are CPU ranks here).
        if backend != "mp":
            raise ValueError("CUDA ranks run with --distributed-executor-backend mp (one GPU per rank on this "
                             "machine); Ray runs CPU ranks in this build: use --device cpu with ray")
        if pp > 1:
            raise ValueError("pipeline parallelism runs CPU ranks in this build (CUDA ranks: tensor parallel only); "
                             "use --pipeline-parallel-size 1 with --device cuda, or --device cpu")
        if not torch.cuda.is_available() or torch.cuda.device_count() < layout.world_size:
            have = torch.cuda.device_count() if torch.cuda.is_available() else 0
            raise ValueError(f"{tp} x {pp} CUDA ranks need {layout.world_size} GPUs, this machine has {have}; lower "
                             "--tensor-parallel-size / --pipeline-parallel-size, or use --device cpu")
        return
    if backend == "mp":
        core_plan(layout.world_size)
    elif backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ValueError("--distributed-executor-backend ray needs the `ray` package; pip install 'ray[default]' "
                         "or use --distributed-executor-backend mp")


def machine_kv_cache_spec(model_config: ModelConfig, layout: ParallelLayout, block_size: int, dtype: str):
    """A KVCacheSpec whose bytes_per_block is what one block id costs the machine summed over every
    rank (sharding.kv_block_bytes): the KV heads of a layer split over a stage's ranks, replicated
    when tp exceeds them. Sizing the one block pool with it keeps all ranks' caches in the budget."""
    from pagedcore.engine.kv_cache import KVCacheSpec

    full = KVCacheSpec.of(model_config, block_size, dtype)
    if layout.world_size == 1:
        return full
    per_head = full.bytes_per_block // model_config.num_kv_heads   # one KV head of every layer, one block
    total = kv_block_bytes(model_config, layout, block_size, dtype)
    if total % per_head:
        raise ValueError(f"sharding.kv_block_bytes gave {total} B per block, not a whole number of KV heads "
                         f"({per_head} B each)")
    return KVCacheSpec(model_config.num_layers, total // per_head, model_config.head_dim, block_size, full.dtype)
