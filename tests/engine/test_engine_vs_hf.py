"""The whole engine (C++ scheduler, paged KV cache, kernels, sampler) against HF transformers.

Greedy output must equal HF token for token in fp32 whatever the engine setting: prefix caching on
or off, a budget small enough to chunk every prefill, a KV cache small enough to force preemption
by recompute and by swap, other block sizes and batch caps, and either KV cache layout (the CPU's
block-major default, or layer-major as on a GPU).
"""

from __future__ import annotations

import pytest
import torch

from pagedcore import LLM, SamplingParams

from .conftest import hf_greedy, prompts_with_shared_prefix

MAX_TOKENS = 24

SETTINGS = {
    "default": dict(),
    "no_prefix_caching": dict(enable_prefix_caching=False),
    "chunked_prefill": dict(max_num_batched_tokens=16, block_size=16),  # prefix hits on short prompts
    "block_size_8_two_seqs": dict(block_size=8, max_num_seqs=2),
    "preempt_recompute": dict(block_size=16, num_gpu_blocks_override=14, max_num_batched_tokens=64),
    "preempt_swap": dict(block_size=16, num_gpu_blocks_override=14, max_num_batched_tokens=64, preemption_mode="swap",
                         swap_space="64MiB"),
    "no_chunking": dict(enable_chunked_prefill=False),
}


@pytest.fixture(scope="module")
def reference(tiny_llama):
    hf_model, _ = tiny_llama
    prompts = prompts_with_shared_prefix(10)
    return prompts, [hf_greedy(hf_model, p, MAX_TOKENS) for p in prompts]


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_greedy_equals_hf(tiny_llama, reference, setting):
    _, folder = tiny_llama
    prompts, expected = reference
    llm = LLM(folder, max_model_len=256, **SETTINGS[setting])
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                           SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True), use_tqdm=False)
    got = [o.outputs[0].token_ids for o in outputs]
    assert got == expected
    stats = llm.llm_engine.scheduler.stats()
    if setting.startswith("preempt"):
        assert stats.num_preemptions > 0, "the setting was meant to force preemption"
    if setting == "chunked_prefill":
        # Prompts admitted over several steps find the shared prefix registered by earlier ones.
        assert stats.prefix_hit_tokens > 0, "shared prompts should hit the prefix cache"
    assert stats.num_free_blocks == llm.llm_engine.scheduler.config.num_gpu_blocks  # nothing leaked
    assert not llm.llm_engine.worker.runner.kv_cache.is_contiguous()   # the CPU's block-major cache


@pytest.mark.parametrize("setting", ["default", "preempt_swap"])
@pytest.mark.parametrize("stack", ["1", "0"])
def test_greedy_equals_hf_on_a_layer_major_cache(tiny_llama, reference, monkeypatch, setting, stack):
    """PAGEDCORE_KV_LAYOUT=layer_major: the layout a GPU cache has, through the decoder stack and the loop."""
    monkeypatch.setenv("PAGEDCORE_KV_LAYOUT", "layer_major")
    monkeypatch.setenv("PAGEDCORE_DECODER_STACK", stack)
    _, folder = tiny_llama
    prompts, expected = reference
    llm = LLM(folder, max_model_len=256, **SETTINGS[setting])
    assert llm.llm_engine.worker.runner.kv_cache.is_contiguous()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                           SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected


def test_logprobs_match_hf(tiny_llama):
    hf_model, folder = tiny_llama
    prompt = prompts_with_shared_prefix(1, seed=3)[0]
    llm = LLM(folder, max_model_len=256)
    out = llm.generate({"prompt_token_ids": prompt},
                       SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3, prompt_logprobs=2),
                       use_tqdm=False)[0]
    tokens = out.outputs[0].token_ids
    with torch.no_grad():
        full = hf_model(torch.tensor([prompt + tokens])).logits[0].float().log_softmax(-1)  # [P + T, vocab]
    for i, (tok, entry) in enumerate(zip(tokens, out.outputs[0].logprobs)):
        ref = full[len(prompt) - 1 + i]
        assert entry[tok].logprob == pytest.approx(ref[tok].item(), abs=1e-3)
        assert entry[tok].rank == 1                      # greedy picks the most likely token
        top = ref.topk(3).indices.tolist()
        assert set(top) <= set(entry)
    assert out.outputs[0].cumulative_logprob == pytest.approx(
        sum(full[len(prompt) - 1 + i, t].item() for i, t in enumerate(tokens)), abs=1e-3)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for p in range(1, len(prompt)):
        assert out.prompt_logprobs[p][prompt[p]].logprob == pytest.approx(full[p - 1, prompt[p]].item(), abs=1e-3)


def test_seeded_sampling_is_reproducible_across_batches(tiny_llama):
    _, folder = tiny_llama
    prompts = prompts_with_shared_prefix(6, seed=5)
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=1234, max_tokens=12, ignore_eos=True)
    llm = LLM(folder, max_model_len=256)
    alone = llm.generate({"prompt_token_ids": prompts[0]}, params, use_tqdm=False)[0].outputs[0].token_ids
    unseeded = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    batch = llm.generate([{"prompt_token_ids": p} for p in prompts[1:]] + [{"prompt_token_ids": prompts[0]}],
                         [unseeded] * 5 + [params], use_tqdm=False)
    assert batch[-1].outputs[0].token_ids == alone
    again = LLM(folder, max_model_len=256, max_num_batched_tokens=16).generate(
        {"prompt_token_ids": prompts[0]}, params, use_tqdm=False)[0].outputs[0].token_ids
    assert again == alone                                # chunked prefill changes nothing either


def test_parallel_samples_share_the_prompt(tiny_llama):
    hf_model, folder = tiny_llama
    prompt = prompts_with_shared_prefix(1, seed=7)[0]
    llm = LLM(folder, max_model_len=256)
    greedy = llm.generate({"prompt_token_ids": prompt},
                          SamplingParams(n=3, temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)[0]
    expected = hf_greedy(hf_model, prompt, 8)
    assert [o.index for o in greedy.outputs] == [0, 1, 2]
    assert all(o.token_ids == expected for o in greedy.outputs)
    sampled = llm.generate({"prompt_token_ids": prompt},
                           SamplingParams(n=4, temperature=1.0, seed=9, max_tokens=8, ignore_eos=True),
                           use_tqdm=False)[0]
    texts = {tuple(o.token_ids) for o in sampled.outputs}
    assert len(texts) > 1                                # children draw from their own generators
    assert llm.llm_engine.scheduler.stats().num_free_blocks == llm.llm_engine.scheduler.config.num_gpu_blocks


def test_stop_strings_abort_and_errors(tiny_llama):
    _, folder = tiny_llama
    llm = LLM(folder, max_model_len=64)
    prompt = prompts_with_shared_prefix(1, seed=11)[0]
    full = llm.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0]
    if len(full.text) >= 6:
        stop = full.text[3:6]
        cut = llm.generate({"prompt_token_ids": prompt},
                           SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, stop=[stop]),
                           use_tqdm=False)[0].outputs[0]
        assert cut.text == full.text[:full.text.find(stop)]
        assert cut.finish_reason == "stop" and cut.stop_reason == stop
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate({"prompt_token_ids": list(range(3, 80))}, SamplingParams(max_tokens=4), use_tqdm=False)
    with pytest.raises(ValueError, match="prompt token ids"):
        llm.generate({"prompt_token_ids": [1, 99999]}, SamplingParams(max_tokens=4), use_tqdm=False)
    engine = llm.llm_engine
    engine.add_request("a", prompt_token_ids=prompt, params=SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    final = engine.abort_request("a")
    assert final.finished and final.outputs[0].finish_reason == "abort"
    assert engine.scheduler.stats().num_free_blocks == engine.scheduler.config.num_gpu_blocks


def test_profile_forward_runs_the_largest_step(tiny_llama):
    """The GPU KV-cache sizing profiles a forward of max_num_batched_tokens; its batch layout is
    exercised here on the CPU (the same code runs on the GPU)."""
    from pagedcore.engine import kv_cache as kvc

    _, folder = tiny_llama
    llm = LLM(folder, max_model_len=64, max_num_batched_tokens=150, max_num_seqs=8, block_size=16,
              num_gpu_blocks_override=32)
    engine = llm.llm_engine
    spec = engine.kv_cache_spec
    shape = kvc.ProfileShape.largest_step(engine.config)
    assert (shape.num_tokens, shape.num_seqs, shape.seq_len, shape.num_logits_rows) == (150, 3, 64, 8)
    scratch = kvc.allocate(spec, shape.num_blocks(spec.block_size))
    # The worker's own runner: the sizing builds no second one.
    engine.worker.runner.profile_forward(scratch, shape.num_tokens, shape.num_seqs, shape.seq_len,
                                         shape.num_logits_rows)
    assert torch.isfinite(scratch[:, :, : -(-shape.num_tokens // spec.block_size)].float()).any()
