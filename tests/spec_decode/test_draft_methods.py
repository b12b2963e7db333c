"""draft_model and layer_skip: greedy with speculation equals HF's greedy, token for token, in every
engine setting of test_greedy_parity.py (prefix caching, chunked prefill, preemption by recompute and
by swap), with drafts that are always right (the target as its own draft: acceptance asserted 100%),
often right (a noisy copy of the target), almost never right (an unrelated random Qwen3) and the
target's first layers (layer_skip)."""

from __future__ import annotations

import pytest

from pagedcore import LLM, SamplingParams

from .test_greedy_parity import MAX_TOKENS, SETTINGS, check_clean, generate, reference  # noqa: F401 (fixture)

ALWAYS = {"disable_by_batch_size": None, "backoff_after_misses": 0}


def draft_spec(folders, which: str, k: int = 4) -> dict:
    return {"method": "draft_model", "model": folders[which], "num_speculative_tokens": k, **ALWAYS}


def layer_skip_spec(num_layers: int, k: int = 3) -> dict:
    return {"method": "layer_skip", "num_layers": num_layers, "num_speculative_tokens": k, **ALWAYS}


def exact_run(tiny_llama, reference, speculative_config: dict, setting: str):
    """Greedy under `setting` with speculation, asserted equal to HF's; returns (scheduler stats of
    the clean engine, the speculator's stats)."""
    _, folder = tiny_llama
    prompts, expected = reference
    llm, got = generate(folder, prompts, speculative_config=speculative_config, **SETTINGS[setting])
    assert got == expected
    return check_clean(llm), llm.llm_engine.speculator.stats


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_target_as_its_own_draft_accepts_everything(tiny_llama, reference, draft_folders, setting):
    stats, spec = exact_run(tiny_llama, reference, draft_spec(draft_folders, "self"), setting)
    assert spec.num_draft_tokens > 0
    assert spec.num_accepted_tokens == spec.num_draft_tokens        # the draft is the target: 100%
    if setting.startswith("preempt"):
        assert stats.num_preemptions > 0, "the setting was meant to force preemption"


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_noisy_draft_greedy_equals_hf(tiny_llama, reference, draft_folders, setting):
    _, spec = exact_run(tiny_llama, reference, draft_spec(draft_folders, "noisy"), setting)
    assert 0 < spec.num_accepted_tokens < spec.num_draft_tokens      # accepted, rejected and bonus paths
    assert spec.accepted_per_pos[-1] > 0                               # all K accepted somewhere


@pytest.mark.parametrize("setting", ["default", "chunked_prefill", "preempt_swap"])
def test_unrelated_random_draft_is_still_exact(tiny_llama, reference, draft_folders, setting):
    _, spec = exact_run(tiny_llama, reference, draft_spec(draft_folders, "random"), setting)
    assert spec.num_draft_tokens > 0 and spec.acceptance_rate < 0.2   # low acceptance, same answers


@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_layer_skip_greedy_equals_hf(tiny_llama, reference, setting, num_layers):
    stats, spec = exact_run(tiny_llama, reference, layer_skip_spec(num_layers), setting)
    assert spec.num_draft_tokens > 0
    if setting.startswith("preempt"):
        assert stats.num_preemptions > 0


def test_steps_without_the_draft_are_caught_up(tiny_llama, reference, draft_folders):
    """Steps run with the speculator unplugged (bench latency's "off" runs) leave blocks without the
    draft's KV; a later prefix-cache hit on them must not cost acceptance (the draft catches up)."""
    _, folder = tiny_llama
    prompts, expected = reference
    llm = LLM(folder, max_model_len=256, speculative_config=draft_spec(draft_folders, "self"))
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    speculator, engine.speculator = engine.speculator, None
    off = llm.generate([{"prompt_token_ids": p} for p in prompts[:3]], params, use_tqdm=False)
    engine.speculator = speculator
    on = llm.generate([{"prompt_token_ids": p} for p in prompts[:3]], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in on] == [o.outputs[0].token_ids for o in off] == expected[:3]
    assert engine.scheduler.stats().prefix_hit_tokens > 0          # the "on" run did hit those blocks
    spec = speculator.stats
    assert spec.num_draft_tokens > 0 and spec.num_accepted_tokens == spec.num_draft_tokens


@pytest.mark.parametrize("lose_the_copy", [False, True])
def test_follow_reuses_the_proposal_kv(tiny_llama, reference, draft_folders, monkeypatch, lose_the_copy):
    """A verifying sequence's follow runs one row, its other rows' K/V copied from the proposal's scratch
    (proposal_kv.py); still 100% acceptance with the target as its own draft. Negative control: the
    copy written to a throwaway tensor (the rows still skipped) must cost acceptance."""
    import pagedcore.spec_decode.draft_model as draft_model_module

    _, folder = tiny_llama
    prompts, expected = reference
    if lose_the_copy:
        original = draft_model_module.reuse_proposal_kv
        monkeypatch.setattr(draft_model_module, "reuse_proposal_kv",
                            lambda step, seq_ids, records, kv: original(step, seq_ids, records, kv.clone()))
    llm = LLM(folder, max_model_len=256, speculative_config=draft_spec(draft_folders, "self"))
    draft = llm.llm_engine.draft
    follow_rows = []
    execute = draft.runner.execute
    draft.runner.execute = lambda step: follow_rows.append(step.num_tokens) or execute(step)
    outs = llm.generate([{"prompt_token_ids": prompts[0]}],
                        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True), use_tqdm=False)
    assert outs[0].outputs[0].token_ids == expected[0]
    spec = llm.llm_engine.speculator.stats
    assert spec.num_drafts > 3 and follow_rows[1:spec.num_drafts + 1] == [1] * spec.num_drafts
    if lose_the_copy:
        assert spec.num_accepted_tokens < spec.num_draft_tokens
    else:
        assert spec.num_accepted_tokens == spec.num_draft_tokens


def test_kv_sizing_counts_the_draft(tiny_llama, draft_folders):
    """One budget: a block id costs target + draft bytes, the scratch comes off the top; the log says both."""
    _, folder = tiny_llama
    plain = LLM(folder, max_model_len=256, kv_cache_memory="4MiB", block_size=16).llm_engine  # the drafts default
    llm = LLM(folder, max_model_len=256, kv_cache_memory="4MiB",
              speculative_config=draft_spec(draft_folders, "random")).llm_engine
    target_block = plain.kv_cache_spec.bytes_per_block
    draft = llm.draft
    assert draft.bytes_per_block > 0 and draft.spec.head_dim == 32                # the Qwen3 draft's own shape
    expected = (4 * 1024**2 - draft.scratch_bytes) // (target_block + draft.bytes_per_block)
    assert llm.scheduler.config.num_gpu_blocks == expected < plain.scheduler.config.num_gpu_blocks
    assert draft.runner.kv_cache.shape[2] == expected + draft.scratch_blocks
    assert "draft model" in llm.kv_cache_description and "scratch" in llm.kv_cache_description
    skip = LLM(folder, max_model_len=256, kv_cache_memory="4MiB", speculative_config=layer_skip_spec(1)).llm_engine
    assert skip.scheduler.config.num_gpu_blocks == (4 * 1024**2 - skip.draft.scratch_bytes) // target_block
    assert skip.worker.runner.kv_cache.shape[2] == skip.scheduler.config.num_gpu_blocks + skip.draft.scratch_blocks
    assert "layer_skip draft" in skip.kv_cache_description
