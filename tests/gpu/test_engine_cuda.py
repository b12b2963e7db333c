"""The engine on a CUDA device: greedy output equals the CPU engine's (tiny random model, fp32)."""

from __future__ import annotations

import pytest
import torch

from pagedcore import LLM, SamplingParams, _core
from tests.engine.conftest import hf_greedy, prompts_with_shared_prefix

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (_core.has_cuda and torch.cuda.is_available()),
                       reason="needs a CUDA device and a build with the CUDA kernels"),
]


@pytest.fixture(scope="module")
def tiny_llama_folder(tmp_path_factory):
    from tests.models import tiny_models

    hf_model = tiny_models.build_hf_model("llama")
    return hf_model, tiny_models.save_hf_folder(hf_model, tmp_path_factory.mktemp("gpu_tiny"))


@pytest.mark.parametrize("setting", [dict(), dict(max_num_batched_tokens=16),
                                     dict(num_gpu_blocks_override=14, preemption_mode="swap", swap_space="64MiB")])
def test_cuda_engine_greedy_equals_hf(tiny_llama_folder, setting):
    hf_model, folder = tiny_llama_folder
    prompts = prompts_with_shared_prefix(6)
    expected = [hf_greedy(hf_model, p, 16) for p in prompts]
    llm = LLM(folder, device="cuda", max_model_len=256, gpu_memory_utilization=0.3, **setting)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                           SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected


def test_cuda_engine_sizes_the_cache_from_a_profiled_step(tiny_llama_folder):
    _, folder = tiny_llama_folder
    llm = LLM(folder, device="cuda", max_model_len=256, gpu_memory_utilization=0.2)
    assert llm.llm_engine.worker.runner.kv_cache.is_cuda
    assert llm.llm_engine.view.kv_cache_bytes > 0
    assert llm.llm_engine.scheduler.config.num_gpu_blocks > 0
    seeded = SamplingParams(temperature=0.8, seed=3, max_tokens=8, ignore_eos=True)
    a = llm.generate({"prompt_token_ids": [5, 6, 7]}, seeded, use_tqdm=False)[0].outputs[0].token_ids
    b = llm.generate({"prompt_token_ids": [5, 6, 7]}, seeded, use_tqdm=False)[0].outputs[0].token_ids
    assert a == b
