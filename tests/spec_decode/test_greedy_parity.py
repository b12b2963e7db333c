"""Greedy output with speculation equals greedy output without it, token for token, and HF's.

The engine settings of tests/engine/test_engine_vs_hf.py (prefix caching, chunked prefill, preemption
by recompute and by swap), with drafts verified in every step: real n-gram drafts, and oracle drafts
that are right for a while and then wrong, so that accepted, rejected and bonus tokens all occur.
"""

from __future__ import annotations

import pytest

from pagedcore import LLM, SamplingParams
from tests.engine.conftest import hf_greedy, prompts_with_shared_prefix
from tests.models import tiny_models

MAX_TOKENS = 40
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
        "disable_by_batch_size": None, "backoff_after_misses": 0}

SETTINGS = {
    "default": dict(),
    "no_prefix_caching": dict(enable_prefix_caching=False),
    "chunked_prefill": dict(max_num_batched_tokens=16),
    "two_seqs_block_8": dict(block_size=8, max_num_seqs=2),
    "preempt_recompute": dict(block_size=16, num_gpu_blocks_override=14, max_num_batched_tokens=64),
    "preempt_swap": dict(block_size=16, num_gpu_blocks_override=14, max_num_batched_tokens=64, preemption_mode="swap",
                         swap_space="64MiB"),
}


@pytest.fixture(scope="module")
def reference(tiny_llama):
    hf_model, _ = tiny_llama
    # Repeated spans give the n-gram proposer something to find.
    prompts = [p + p[-12:] for p in prompts_with_shared_prefix(8, seed=5)]
    return prompts, [hf_greedy(hf_model, p, MAX_TOKENS) for p in prompts]


def generate(folder, prompts, max_tokens=MAX_TOKENS, **engine):
    llm = LLM(folder, max_model_len=256, **engine)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True), use_tqdm=False)
    return llm, [o.outputs[0].token_ids for o in outs]


def check_clean(llm):
    sched = llm.llm_engine.scheduler
    stats = sched.stats()
    assert stats.num_free_blocks == sched.config.num_gpu_blocks      # nothing leaked by rollbacks
    return stats


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_oracle_drafts_greedy_equals_hf(tiny_llama, reference, oracle, setting):
    _, folder = tiny_llama
    prompts, expected = reference
    proposer = oracle(prompts, expected, tiny_models.VOCAB_SIZE)
    llm, got = generate(folder, prompts, speculative_config=SPEC, **SETTINGS[setting])
    assert got == expected
    stats = check_clean(llm)
    spec = llm.llm_engine.speculator.stats
    assert proposer.calls > 0 and spec.num_drafts > 0
    # Acceptance at every position and rejections too: each path of verification ran.
    assert all(n > 0 for n in spec.accepted_per_pos), spec.accepted_per_pos
    assert 0 < spec.num_accepted_tokens < spec.num_draft_tokens
    if setting.startswith("preempt"):
        assert stats.num_preemptions > 0, "the setting was meant to force preemption"


@pytest.mark.parametrize("setting", ["default", "chunked_prefill", "preempt_recompute", "preempt_swap"])
def test_ngram_drafts_greedy_equals_hf(tiny_llama, reference, setting):
    _, folder = tiny_llama
    prompts, expected = reference
    llm, got = generate(folder, prompts, speculative_config=SPEC, **SETTINGS[setting])
    assert got == expected
    check_clean(llm)
    assert llm.llm_engine.speculator.stats.num_draft_tokens > 0


def test_stops_inside_accepted_drafts(tiny_llama, reference, oracle):
    """max_tokens and a stop token id reached in the middle of accepted drafts: nothing after them."""
    hf_model, folder = tiny_llama
    prompts, expected = reference
    oracle(prompts, expected, tiny_models.VOCAB_SIZE)
    llm = LLM(folder, max_model_len=256, speculative_config=SPEC)
    params = [SamplingParams(temperature=0, max_tokens=7 + i, ignore_eos=True) for i in range(4)]
    stop_at = [e[5] for e in expected[4:]]
    params += [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, stop_token_ids=[t])
               for t in stop_at]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for i, out in enumerate(outs[:4]):
        assert out.outputs[0].token_ids == expected[i][:7 + i]
        assert out.outputs[0].finish_reason == "length"
    for j, out in enumerate(outs[4:]):
        e = expected[4 + j]
        cut = e.index(stop_at[j]) + 1
        assert out.outputs[0].token_ids == e[:cut]
        assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop_at[j]
    check_clean(llm)


def test_stop_strings_and_text_match_no_speculation(tiny_llama, reference, oracle):
    """A stop string matched inside a step's accepted tokens ends the output where it would without
    speculation (text, token ids, finish reason)."""
    _, folder = tiny_llama
    prompts, expected = reference
    oracle(prompts, expected, tiny_models.VOCAB_SIZE)
    runs = []
    for spec in (None, SPEC):
        llm = LLM(folder, max_model_len=256, speculative_config=spec)
        tok = llm.get_tokenizer()
        stops = [next((t for t in (tok.decode(e[k:k + 2]) for k in range(6, MAX_TOKENS - 2)) if t.strip()), None)
                 for e in expected]
        params = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True,
                                 stop=[s] if s else None) for s in stops]
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        runs.append([(o.outputs[0].text, o.outputs[0].token_ids, o.outputs[0].finish_reason,
                      o.outputs[0].stop_reason) for o in outs])
        check_clean(llm)
    assert runs[0] == runs[1]
    assert any(r[2] == "stop" for r in runs[0])
