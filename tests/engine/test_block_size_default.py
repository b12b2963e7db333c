"""--block-size left unset: 128 tokens a block on the CPU, as vLLM-CPU defaults there; 16 on a GPU (vLLM's CUDA
default) and where a draft model proposes (its scratch blocks and per-step tail-block copies grow with the
block). An explicit size always wins. The engine's KV cache, scheduler and prefix cache then work in those
blocks: a repeated prompt reuses whole 128-token blocks, and greedy output equals HF's (the scheduling settings
of test_engine_vs_hf.py run at the default too)."""

from __future__ import annotations

import argparse

import pytest
import torch

from pagedcore import LLM, SamplingParams
from pagedcore.config import CPU_DEFAULT_BLOCK_SIZE, SMALL_BLOCK_SIZE, EngineConfig
from pagedcore.entrypoints.engine_args import add_engine_args, engine_config_from_args
from tests.engine.conftest import hf_greedy
from tests.models import tiny_models


@pytest.mark.parametrize("options,expected", [
    (dict(), CPU_DEFAULT_BLOCK_SIZE),
    (dict(speculative_config={"method": "ngram", "num_speculative_tokens": 4}), CPU_DEFAULT_BLOCK_SIZE),
    (dict(speculative_config={"method": "draft_model", "model": "draft", "num_speculative_tokens": 2}),
     SMALL_BLOCK_SIZE),
    (dict(speculative_config={"method": "layer_skip", "num_layers": 1, "num_speculative_tokens": 2}),
     SMALL_BLOCK_SIZE),
    (dict(device="cuda"), SMALL_BLOCK_SIZE),
    (dict(block_size=32), 32),
    (dict(block_size=16, speculative_config={"method": "ngram"}), 16),
])
def test_the_default_block_size(options, expected):
    assert CPU_DEFAULT_BLOCK_SIZE == 128 and SMALL_BLOCK_SIZE == 16
    assert EngineConfig(**options).block_size == expected


def test_the_flag_defaults_to_the_config_rule():
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert parser.parse_args([]).block_size is None
    assert engine_config_from_args(parser.parse_args([])).block_size == 128
    assert engine_config_from_args(parser.parse_args(["--block-size", "16"])).block_size == 16
    with pytest.raises(ValueError, match="block_size must be a power of two"):
        engine_config_from_args(parser.parse_args(["--block-size", "48"]))


def test_an_engine_at_the_default_caches_whole_128_token_blocks(tiny_llama):
    hf_model, folder = tiny_llama
    llm = LLM(folder, max_model_len=256, kv_cache_memory="16MiB")
    engine = llm.llm_engine
    assert engine.scheduler.config.block_size == 128
    assert engine.worker.runner.kv_cache.shape[4] == 128  # [layers, 2, blocks, kv heads, block_size, head_dim]
    prompt = torch.randint(3, tiny_models.VOCAB_SIZE, (200,), generator=torch.Generator().manual_seed(3)).tolist()
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    first = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0]
    second = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0]
    assert first.metrics.num_cached_tokens == 0
    assert second.metrics.num_cached_tokens == 128  # the one full block of the 200-token prompt
    expected = hf_greedy(hf_model, prompt, 8)
    assert first.outputs[0].token_ids == second.outputs[0].token_ids == expected
    assert engine.scheduler.stats().num_free_blocks == engine.scheduler.config.num_gpu_blocks   # nothing leaked
