"""Start-up checks of a parallel run (refused before any weight loads, naming the flag and the fix)
and the core-binding plan of its ranks."""

from __future__ import annotations

import dataclasses
import time

import pytest

from pagedcore import LLM
from pagedcore.config import EngineConfig
from pagedcore.distributed.parallel_config import (check_parallel_config, core_plan, executor_backend,
                                                   machine_kv_cache_spec, parallel_layout, usable_cores)
from pagedcore.distributed.rank import ParallelLayout
from pagedcore.distributed.sharding import kv_block_bytes
from pagedcore.engine.kv_cache import KVCacheSpec
from pagedcore.model_config import ModelConfig

# The default model's shape (SmolLM2-135M): 9 query heads, 3 KV heads, 30 layers.
SMOL = ModelConfig(architecture="LlamaForCausalLM", hidden_size=576, intermediate_size=1536, num_layers=30,
                   num_heads=9, num_kv_heads=3, head_dim=64, vocab_size=49152, rms_norm_eps=1e-5,
                   rope_theta=1e5, max_position_embeddings=8192, tie_word_embeddings=True)


def config(**kw) -> EngineConfig:
    return EngineConfig(**kw)


def test_core_plan_gives_each_rank_its_own_contiguous_slice():
    assert core_plan(2, (0, 1)) == [(0,), (1,)]
    assert core_plan(1, (0, 1)) == [(0, 1)]
    assert core_plan(3, tuple(range(8))) == [(0, 1, 2), (3, 4, 5), (6, 7)]
    assert core_plan(2, (4, 5, 6, 7)) == [(4, 5), (6, 7)]
    plan = core_plan(4, tuple(range(10)))
    assert sorted(c for cores in plan for c in cores) == list(range(10))   # every core used once


def test_more_ranks_than_cores_is_refused_naming_the_core_count(monkeypatch):
    with pytest.raises(ValueError, match=r"4 model ranks .* 2 core\(s\) \[0, 1\]; lower --tensor-parallel-size"):
        core_plan(4, (0, 1))
    from pagedcore.distributed import parallel_config

    monkeypatch.setattr(parallel_config, "usable_cores", lambda: (0, 1))   # a 2-core affinity mask
    with pytest.raises(ValueError, match=r"3 model ranks .* may use 2 core"):
        check_parallel_config(config(tensor_parallel_size=3), SMOL)
    # The Ray backend places ranks on the cluster: this machine's cores do not bound it.
    if _ray_importable():
        check_parallel_config(config(tensor_parallel_size=3, distributed_executor_backend="ray"), SMOL)


def test_backend_is_mp_when_the_model_needs_ranks():
    assert executor_backend(config()) is None
    assert executor_backend(config(tensor_parallel_size=2)) == "mp"
    assert executor_backend(config(pipeline_parallel_size=2, distributed_executor_backend="ray")) == "ray"
    assert executor_backend(config(distributed_executor_backend="mp")) == "mp"   # vLLM: mp even for one rank
    assert parallel_layout(config(tensor_parallel_size=2, pipeline_parallel_size=3)) == ParallelLayout(2, 3)


@pytest.mark.parametrize("kw, message", [
    (dict(tensor_parallel_size=4), r"--tensor-parallel-size 4 does not split .* use --tensor-parallel-size in"),
    (dict(pipeline_parallel_size=31), r"--pipeline-parallel-size 31 exceeds the model's 30 layers"),
    (dict(pipeline_parallel_size=2, enable_lora=True), r"LoRA adapters \(--enable-lora\) do not run"),
    (dict(tensor_parallel_size=2, device="cuda"), r"2 x 1 CUDA ranks need 2 GPUs, this machine has 0"),
    (dict(pipeline_parallel_size=2, device="cuda"), r"CUDA ranks: tensor parallel only"),
    (dict(tensor_parallel_size=2, device="cuda", distributed_executor_backend="ray"),
     r"CUDA ranks run with --distributed-executor-backend mp"),
])
def test_bad_combinations_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        check_parallel_config(config(**kw), SMOL)


def test_auto_with_parallelism_keeps_the_blocks_on_the_cpu():
    # TP ranks cut a GGUF's blocks as stored (distributed/block_cuts.py), PP stages move whole layers; a GPU
    # dequantises under auto.
    assert config(tensor_parallel_size=2).dtype == "auto"
    assert config(pipeline_parallel_size=2).dtype == "auto"
    assert config(tensor_parallel_size=2, device="cuda").dtype == "float32"


def test_good_combinations_pass():
    check_parallel_config(config(tensor_parallel_size=2), SMOL)          # uneven: 6 + 3 query heads
    check_parallel_config(config(pipeline_parallel_size=2), SMOL)
    check_parallel_config(config(pipeline_parallel_size=2, dtype="auto"), SMOL)   # PP moves whole layers
    check_parallel_config(config(tensor_parallel_size=2, dtype="auto"), SMOL)     # Q4_1 cut on whole blocks
    check_parallel_config(config(tensor_parallel_size=2, quantization="gguf"), SMOL)
    check_parallel_config(config(tensor_parallel_size=2, quantization="int8_per_channel"), SMOL)
    check_parallel_config(config(), SMOL)                                # one process: nothing to check


def _ray_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def test_the_engine_refuses_before_loading_any_weight(monkeypatch):
    """The driver reads the config only; a refused layout never reaches a weight loader or a spawn."""
    import pagedcore.loader.model_loader as model_loader

    def no_weights(*a, **k):
        raise AssertionError("weights were loaded before the layout was checked")

    monkeypatch.setattr(model_loader, "build_model", no_weights)
    start = time.monotonic()
    with pytest.raises(ValueError, match="--tensor-parallel-size 4 does not split"):
        LLM(tensor_parallel_size=4)
    assert time.monotonic() - start < 60   # a generous bound on a loaded machine: no model was built


@pytest.mark.parametrize("tp, pp", [(1, 1), (2, 1), (1, 2), (3, 1), (2, 3)])
def test_the_block_pool_is_sized_by_every_rank_s_share(tp, pp):
    layout = ParallelLayout(tp, pp)
    spec = machine_kv_cache_spec(SMOL, layout, 16, "float32")
    assert spec.bytes_per_block == kv_block_bytes(SMOL, layout, 16, "float32")
    # Three KV heads split over ranks: the machine pays for each once, whatever the layout.
    assert spec.bytes_per_block == KVCacheSpec.of(SMOL, 16, "float32").bytes_per_block


def test_replicated_kv_heads_cost_every_rank_holding_them():
    one_kv = dataclasses.replace(SMOL, num_heads=8, num_kv_heads=1)
    spec = machine_kv_cache_spec(one_kv, ParallelLayout(2, 1), 16, "bfloat16")
    assert spec.bytes_per_block == 2 * KVCacheSpec.of(one_kv, 16, "bfloat16").bytes_per_block


def test_a_draft_model_with_worker_ranks_is_refused_before_any_weight_loads(monkeypatch):
    """draft_model / layer_skip run their draft in the engine process: with ranks it is a start-up error
    from the config alone (the ranks never start)."""
    from pagedcore.config import EngineConfig
    from pagedcore.distributed import parallel_config
    from pagedcore.distributed.model_metadata import load_model_metadata

    loaded, _ = load_model_metadata(None, dtype="float32", quantization=None)
    config = EngineConfig(tensor_parallel_size=2, speculative_config={"method": "layer_skip", "num_layers": 8,
                                                                      "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match='"layer_skip" .* does not run with worker ranks'):
        parallel_config.check_parallel_config(config, loaded.config)
