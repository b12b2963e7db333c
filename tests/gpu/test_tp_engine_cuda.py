"""Tensor parallelism on CUDA ranks (one GPU per rank, NCCL all-reduce): TP=2 gives the greedy tokens of
HF transformers and of the one-GPU engine, fp32, on a tiny model whose heads split unevenly and on the
default model, with prefix caching, chunked prefill and preemption in play. Needs two GPUs and a build
with the CUDA kernels and NCCL; never run on a machine of this project yet (none had two GPUs)."""

from __future__ import annotations

import pytest
import torch

from pagedcore import LLM, SamplingParams, _core
from tests.engine.conftest import hf_greedy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.multi_gpu,
    pytest.mark.skipif(not (_core.has_cuda and torch.cuda.is_available() and torch.cuda.device_count() >= 2),
                       reason="needs two CUDA devices and a build with the CUDA kernels"),
]

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def uneven_model(tmp_path_factory):
    """(hf_model, folder): 6 query / 3 KV heads, so TP=2 splits 4 + 2 query heads (as SmolLM2's 9 / 3)."""
    from tests.models import tiny_models

    hf_model = tiny_models.build_hf_model("qwen2_uneven")
    return hf_model, tiny_models.save_hf_folder(hf_model, tmp_path_factory.mktemp("tp_cuda_uneven"))


def _prompts(vocab_size: int, num: int = 6) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    system = torch.randint(3, vocab_size, (40,), generator=g).tolist()   # a shared prefix: cache hits
    return [(system if i % 2 else []) + torch.randint(3, vocab_size, (5 + 7 * i,), generator=g).tolist()
            for i in range(num)]


@pytest.mark.parametrize("setting", [dict(), dict(max_num_batched_tokens=16),
                                     dict(num_gpu_blocks_override=14, preemption_mode="swap", swap_space="64MiB")])
def test_tp2_on_two_gpus_equals_hf(uneven_model, setting):
    hf_model, folder = uneven_model
    prompts = _prompts(hf_model.config.vocab_size)
    expected = [hf_greedy(hf_model, p, 16) for p in prompts]
    with LLM(folder, device="cuda", tensor_parallel_size=2, max_model_len=256, gpu_memory_utilization=0.3,
             **setting) as llm:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected


def test_tp2_on_two_gpus_equals_one_gpu_on_the_default_model():
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    one = LLM(device="cuda", dtype="float32", max_model_len=512, gpu_memory_utilization=0.3)
    expected = [o.outputs[0].token_ids for o in one.generate(prompts, GREEDY, use_tqdm=False)]
    del one
    torch.cuda.empty_cache()
    with LLM(device="cuda", dtype="float32", tensor_parallel_size=2, max_model_len=512,
             gpu_memory_utilization=0.3) as llm:
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    assert got == expected
