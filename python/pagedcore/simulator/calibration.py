"""Calibration: time the real engine on a workload that spreads the cost model's features apart, then fit.

Decode-only steps alone make num_tokens == num_seqs (their coefficients would be confounded), so the
workload comes in waves: prompts of very different lengths (prefill chunks of 8..512 tokens) join
while earlier requests decode at various context lengths.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from pagedcore.simulator.cost_model import CostModel, fit_from_trace

logger = logging.getLogger(__name__)

NUM_WARMUP_STEPS = 3   # first steps pay one-off costs (allocator, thread pools): left out of the fit


def measure_swap_seconds_per_block(engine, num_blocks: int = 32, repeats: int = 5) -> float:
    """One block's KV (all layers, K and V) copied between two host buffers: what a swap moves."""
    import torch

    numel = engine.view.kv_cache_bytes_per_block // 4   # float32 elements of one block
    src = torch.randn(num_blocks, numel)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return best / num_blocks


def record_calibration(path: str, model: str | None = None, num_threads: int | None = None,
                       num_waves: int = 8, seed: int = 0) -> CostModel:
    from pagedcore.config import EngineConfig
    from pagedcore.engine.llm_engine import LLMEngine
    from pagedcore.sampling_params import SamplingParams
    from pagedcore.simulator.recorder import TraceRecorder

    engine = LLMEngine(EngineConfig(model=model, enable_trace=True, kv_cache_memory="256MiB", max_model_len=1024,
                                    max_num_batched_tokens=512, num_threads=num_threads,
                                    enable_prefix_caching=False))
    recorder = TraceRecorder(trace_file=path).attach(engine)
    rng = np.random.default_rng(seed)
    vocab = engine.view.model_config.vocab_size
    t0, next_id = time.perf_counter(), 0
    for wave in range(num_waves):
        for _ in range(int(rng.integers(2, 12))):
            prompt = rng.integers(10, vocab - 1, int(rng.choice([8, 24, 64, 160, 300, 600]))).tolist()
            engine.add_request(f"cal-{next_id}", prompt_token_ids=prompt,
                               params=SamplingParams(max_tokens=int(rng.integers(4, 40)), ignore_eos=True))
            next_id += 1
        # Let this wave decode a while before the next one arrives (a mix of batch sizes and contexts).
        for _ in range(int(rng.integers(3, 12))):
            if engine.has_unfinished_requests():
                engine.step()
    while engine.has_unfinished_requests():
        engine.step()
    recorder.close()
    logger.info("calibration: %d steps in %.0f s", recorder.num_records, time.perf_counter() - t0)
    e = measure_swap_seconds_per_block(engine)
    fitted = fit_from_trace(path, e=e, skip_steps=NUM_WARMUP_STEPS)
    source = (f"fitted to {fitted.fit['num_steps']} steps of {engine.view.model_path} "
              f"({engine.view.config.dtype}, {num_threads or 'all'} threads); e from a host copy benchmark")
    return CostModel(fitted.a, fitted.b, fitted.c, fitted.d, fitted.e, source=source, fit=fitted.fit)
