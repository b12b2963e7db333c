"""Mixed-adapter batches against HF transformers with each adapter merged (merge_and_unload), fp32.

One batch mixes the base model and three adapters (ranks 4, 8, 16; attention-only, all seven
projections, MLP + k with rsLoRA); every row must give HF's greedy tokens for its adapter and
logprobs within 1e-3, with prefix caching (prompts share a prefix across adapters: no block may be
shared between them), chunked prefill, preemption (recompute and swap), and max_loras below the
number of adapters (the scheduler holds some back a step).
"""

from __future__ import annotations

import pytest
import torch

from pagedcore import LLM, SamplingParams
from pagedcore.lora import LoRARequest
from tests.engine.conftest import hf_greedy, prompts_with_shared_prefix

MAX_TOKENS = 12

SETTINGS = {
    "default": dict(max_loras=3),
    "max_loras_2": dict(max_loras=2),
    "chunked_prefill": dict(max_loras=3, max_num_batched_tokens=16),
    "preempt_recompute": dict(max_loras=3, block_size=16, num_gpu_blocks_override=14, max_num_batched_tokens=64),
    "preempt_swap": dict(max_loras=2, block_size=16, num_gpu_blocks_override=14, max_num_batched_tokens=64,
                         preemption_mode="swap", swap_space="64MiB"),
    "no_prefix_caching": dict(max_loras=1, enable_prefix_caching=False),
}


@pytest.fixture(scope="module")
def batch(tiny_base, adapters):
    """(prompts, lora requests (None: base), HF greedy tokens) of 8 rows: each prompt under every adapter choice."""
    hf_base, _ = tiny_base
    prompts = prompts_with_shared_prefix(4, seed=5)
    requests = [None] + [LoRARequest(spec.name, i + 1, folder) for i, (spec, folder, _) in enumerate(adapters)]
    models = [hf_base] + [merged for _, _, merged in adapters]
    rows = [(prompts[(j + k) % len(prompts)], k) for j in range(2) for k in range(4)]  # 8 rows, adapters mixed
    expected = [hf_greedy(models[k], prompt, MAX_TOKENS) for prompt, k in rows]
    return [p for p, _ in rows], [requests[k] for _, k in rows], expected, [models[k] for _, k in rows]


def test_adapters_change_the_output(batch):
    prompts, requests, expected, _ = batch
    by_prompt = {}
    for prompt, request, tokens in zip(prompts, requests, expected):
        by_prompt.setdefault(tuple(prompt), {})[request.lora_name if request else None] = tokens
    differing = sum(len({tuple(t) for t in d.values()}) > 1 for d in by_prompt.values())
    assert differing == len(by_prompt), "each adapter should change the greedy output of its prompts"


def _count_one_call_adapter_steps(monkeypatch) -> list[int]:
    """[steps the one-call decoder (models/greedy_decode.py) ran with adapter rows], counted as they run."""
    from pagedcore.models import greedy_decode

    count = [0]
    original = greedy_decode.GreedyDecode.__call__

    def counted(decoder, step, kv_cache, *args, **kwargs):
        batch_ref = decoder.stack.lora_batch
        count[0] += batch_ref is not None and batch_ref.batch is not None
        return original(decoder, step, kv_cache, *args, **kwargs)
    monkeypatch.setattr(greedy_decode.GreedyDecode, "__call__", counted)
    return count


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_mixed_batch_equals_hf_merged(tiny_base, batch, setting, monkeypatch):
    _, folder = tiny_base
    prompts, requests, expected, models = batch
    one_call_steps = _count_one_call_adapter_steps(monkeypatch)
    llm = LLM(folder, max_model_len=256, enable_lora=True, max_lora_rank=16, max_cpu_loras=3, **SETTINGS[setting])
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=1)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False, lora_request=requests)
    got = [o.outputs[0].token_ids for o in outputs]
    assert got == expected
    # Adapter steps took the one C++ call (embedding, layers with their adapter terms, head, argmax).
    assert one_call_steps[0] > 0
    for prompt, out, model in zip(prompts, outputs, models):
        tokens = out.outputs[0].token_ids
        with torch.no_grad():
            ref = model(torch.tensor([prompt + tokens])).logits[0].float().log_softmax(-1)  # [P + T, vocab]
        for i, (tok, entry) in enumerate(zip(tokens, out.outputs[0].logprobs)):
            assert entry[tok].logprob == pytest.approx(ref[len(prompt) - 1 + i, tok].item(), abs=1e-3)
    stats = llm.llm_engine.scheduler.stats()
    if setting.startswith("preempt"):
        assert stats.num_preemptions > 0, "the setting was meant to force preemption"
    assert stats.num_free_blocks == llm.llm_engine.scheduler.config.num_gpu_blocks  # nothing leaked


def test_same_prompt_under_two_adapters_never_shares_blocks(tiny_base, adapters):
    """Run a prompt under adapter 1, then the same prompt under adapter 2 and the base: the later
    ones must miss the prefix cache (their KV differs) and still match HF."""
    hf_base, folder = tiny_base
    (s1, f1, m1), (s2, f2, m2) = adapters[0], adapters[1]
    prompt = prompts_with_shared_prefix(2, seed=9)[1]  # 40-token shared prefix + tail: several full blocks
    llm = LLM(folder, max_model_len=256, enable_lora=True, max_loras=2, block_size=16)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    first = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False, lora_request=LoRARequest(s1.name, 1, f1))
    hits_before = llm.llm_engine.scheduler.stats().prefix_hit_tokens
    second = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False, lora_request=LoRARequest(s2.name, 2, f2))
    base = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)
    assert llm.llm_engine.scheduler.stats().prefix_hit_tokens == hits_before
    again = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False, lora_request=LoRARequest(s1.name, 1, f1))
    assert llm.llm_engine.scheduler.stats().prefix_hit_tokens > hits_before  # same adapter: a hit
    assert first[0].outputs[0].token_ids == again[0].outputs[0].token_ids == hf_greedy(m1, prompt, 6)
    assert second[0].outputs[0].token_ids == hf_greedy(m2, prompt, 6)
    assert base[0].outputs[0].token_ids == hf_greedy(hf_base, prompt, 6)
