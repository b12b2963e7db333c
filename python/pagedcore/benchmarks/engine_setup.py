"""Building the engine for a bench command and describing it: the one place the bench commands
turn CLI flags into an LLMEngine, so every command reports the same setup fields."""

from __future__ import annotations

import time

from pagedcore.entrypoints.engine_args import engine_config_from_args


def build_engine(args, **overrides):
    """(engine, setup dict). Start-up is timed from the constructor call (model load + KV cache + scheduler);
    then the KV cache's background commit (kv_cache_commit="background") is waited for, and timed apart,
    so that nothing but the benchmark runs from its first step."""
    from pagedcore.engine.llm_engine import LLMEngine

    t0 = time.perf_counter()
    engine = LLMEngine(engine_config_from_args(args, **overrides))
    startup = time.perf_counter() - t0
    t1 = time.perf_counter()
    engine.wait_for_kv_commit()
    commit_wait = time.perf_counter() - t1
    view = engine.view
    cfg = view.config
    setup = {"model": cfg.model or "default (SmolLM2-135M-Instruct GGUF)", "dtype": cfg.dtype,
             "weight_format": engine.loaded.weight_format, "weight_bytes": dict(engine.loaded.weight_bytes),
             "startup_seconds": startup, "load_seconds": view.load_seconds, "kv_commit_wait_seconds": commit_wait,
             "kv_cache": view.kv_cache_description, "kv_cache_bytes": view.kv_cache_bytes,
             "max_num_seqs": cfg.max_num_seqs, "max_num_batched_tokens": cfg.max_num_batched_tokens,
             "max_model_len": cfg.max_model_len, "enable_prefix_caching": cfg.enable_prefix_caching,
             "enable_chunked_prefill": cfg.enable_chunked_prefill}
    report = view.memory_report()
    if report.draft_weight_bytes or report.draft_kv_cache_bytes:   # speculation's draft model, same budget
        setup["draft_weight_bytes"] = report.draft_weight_bytes
        setup["draft_kv_cache_bytes"] = report.draft_kv_cache_bytes
    return engine, setup


def warm_up(engine, vocab_size: int) -> None:
    """One short request, so the first timed step does not pay one-time costs (allocator growth,
    kernel dispatch caches, lazy imports in the sampler)."""
    from pagedcore.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    engine.add_request("__warmup__", prompt_token_ids=[min(100, vocab_size - 1)] * 24, params=params,
                       output_kind="final")
    while engine.has_unfinished_requests():
        engine.step()
