"""Multi-step scheduling (vLLM's num_scheduler_steps, engine/multi_step.py): greedy output equals HF's and
the single-step engine's, token for token and text for text, in every scheduling setting; sampled output
(temperature, top-k, top-p, min-p; seeded, and unseeded under torch.manual_seed) equals the single
steps'; stops inside a multi-step cut where single steps stop; arrivals, torch-sampled requests and
aborts make the engine fall back to single steps without changing anything; no block leaks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedcore import LLM, SamplingParams
from pagedcore.config import EngineConfig
from pagedcore.engine.llm_engine import LLMEngine
from pagedcore.entrypoints.engine_args import add_engine_args, engine_config_from_args
from tests.engine.conftest import hf_greedy, prompts_with_shared_prefix
from tests.engine.test_engine_vs_hf import SETTINGS   # every scheduling setting the HF test holds

MAX_TOKENS = 30
STEPS = 4


@pytest.fixture(scope="module")
def reference(tiny_llama):
    hf_model, _ = tiny_llama
    prompts = prompts_with_shared_prefix(8, seed=11)
    return prompts, [hf_greedy(hf_model, p, MAX_TOKENS) for p in prompts]


def greedy(max_tokens=MAX_TOKENS, **kw):
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kw)


def check_clean(llm):
    sched = llm.llm_engine.scheduler
    stats = sched.stats()
    assert stats.num_free_blocks == sched.config.num_gpu_blocks   # nothing leaked by placeholders
    return stats


def outputs(outs):
    return [(o.outputs[0].text, o.outputs[0].token_ids, o.outputs[0].finish_reason, o.outputs[0].stop_reason)
            for o in outs]


def generate_counting(folder, prompts, steps, **engine):
    """(llm, token ids, tokens computed over the run, steps run)."""
    llm = LLM(folder, max_model_len=256, num_scheduler_steps=steps, **engine)
    computed = []
    llm.llm_engine.step_listeners.append(lambda out, result, timing: computed.append(out.num_tokens))
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(), use_tqdm=False)
    return llm, [o.outputs[0].token_ids for o in outs], sum(computed), len(computed)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_multi_step_greedy_equals_hf(tiny_llama, reference, setting):
    _, folder = tiny_llama
    prompts, expected = reference
    llm, got, computed, num_steps = generate_counting(folder, prompts, STEPS, **SETTINGS[setting])
    assert got == expected
    stats = check_clean(llm)
    assert llm.llm_engine.multi_step.multi_steps > 0
    if setting.startswith("preempt"):
        assert stats.num_preemptions > 0, "the setting was meant to force preemption"
        return
    # The KV of every token a multi-step chose is kept: no position is computed twice, in fewer steps.
    _, single, single_computed, single_steps = generate_counting(folder, prompts, 1, **SETTINGS[setting])
    assert single == expected
    assert computed == single_computed and num_steps < single_steps


def test_stops_inside_a_multi_step_cut_where_single_steps_stop(tiny_llama, reference):
    """max_tokens, stop token ids and stop strings reached inside a multi-step: the same tokens, text and
    finish reasons as single steps, and nothing after them."""
    _, folder = tiny_llama
    prompts, expected = reference
    runs = []
    for steps in (1, 8):
        llm = LLM(folder, max_model_len=256, num_scheduler_steps=steps)
        tok = llm.get_tokenizer()
        params = [greedy(5 + i) for i in range(3)]                                    # 5, 6, 7 tokens
        params += [greedy(stop_token_ids=[e[6 + i]]) for i, e in enumerate(expected[3:6])]
        stops = [next((t for t in (tok.decode(e[k:k + 2]) for k in range(9, MAX_TOKENS - 2)) if t.strip()), None)
                 for e in expected[6:]]
        params += [greedy(stop=[s] if s else None) for s in stops]
        runs.append(outputs(llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)))
        check_clean(llm)
    assert runs[0] == runs[1]
    for i in range(3):
        assert runs[1][i][1] == expected[i][:5 + i] and runs[1][i][2] == "length"
    for i, e in enumerate(expected[3:6]):
        assert runs[1][3 + i][1] == e[:e.index(e[6 + i]) + 1] and runs[1][3 + i][2] == "stop"
    assert any(r[2] == "stop" and isinstance(r[3], str) for r in runs[1][6:])


def _drive(folder, steps: int):
    """One engine, requests arriving and leaving between steps: greedy A and C, sampled B (seeded; not a
    plain decode while the C++ sampler is off), D aborted."""
    engine = LLMEngine(EngineConfig(model=str(folder), max_model_len=256, num_scheduler_steps=steps))
    prompts = prompts_with_shared_prefix(4, seed=3)
    done, counts = {}, []
    engine.add_request("A", prompt_token_ids=prompts[0], params=greedy(25))
    engine.add_request("D", prompt_token_ids=prompts[3], params=greedy(25))
    for i in range(40):
        if i == 3:
            engine.add_request("B", prompt_token_ids=prompts[1],
                               params=SamplingParams(temperature=0.9, top_p=0.9, seed=7, max_tokens=6))
        if i == 6:
            engine.abort_request("D")
        if i == 9:
            engine.add_request("C", prompt_token_ids=prompts[2], params=greedy(20))
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
        counts.append(engine.multi_step.multi_steps if engine.multi_step else 0)
        if not engine.has_unfinished_requests():
            break
    return engine, done, counts


def test_arrivals_torch_sampled_rows_and_aborts_fall_back_without_changing_tokens(tiny_llama, monkeypatch):
    _, folder = tiny_llama
    monkeypatch.setenv("PAGEDCORE_CPU_SAMPLER", "0")   # B sampled by torch: single steps while it runs
    _, single, _ = _drive(folder, 1)
    engine, multi, counts = _drive(folder, STEPS)
    assert multi == single and set(multi) == {"A", "B", "C"}
    assert counts[-1] > 0                     # multi-steps ran (A alone, then A and C) ...
    assert counts[4] == counts[3]             # ... but not while B was running
    stats = engine.scheduler.stats()
    assert stats.num_free_blocks == engine.scheduler.config.num_gpu_blocks


def test_a_step_the_call_declines_is_verified_as_drafts(tiny_llama, reference, monkeypatch):
    """The worker refuses the one call: the placeholders go through the forward and each sequence keeps
    its first row's argmax: HF's tokens still, one a step."""
    _, folder = tiny_llama
    prompts, expected = reference
    llm = LLM(folder, max_model_len=256, num_scheduler_steps=STEPS)
    monkeypatch.setattr(llm.llm_engine.worker, "execute_multi_step", lambda step, *args: None)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected
    ms = llm.llm_engine.multi_step
    assert ms.multi_steps == 0 and ms.verified_steps > 0
    check_clean(llm)


def test_config_and_flag():
    with pytest.raises(ValueError, match="num_scheduler_steps must be an integer from 1 to 64"):
        EngineConfig(num_scheduler_steps=0)
    with pytest.raises(ValueError, match="cannot be combined"):
        EngineConfig(num_scheduler_steps=4, speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    import argparse

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--num-scheduler-steps", "8"])
    assert engine_config_from_args(args).num_scheduler_steps == 8


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    as_int = {4: torch.int32, 2: torch.int16, 1: torch.uint8}[a.element_size()]
    return torch.equal(a.view(as_int), b.view(as_int))


def test_run_steps_checks_every_index_before_writing_the_cache(tiny_llama):
    _, folder = tiny_llama
    llm = LLM(folder, max_model_len=256)
    runner = llm.llm_engine.worker.runner
    decoder = runner.model.greedy_decoder()
    before = runner.kv_cache.clone()
    ids = np.array([5, 0, 0], dtype=np.int64)
    good = dict(input_ids=ids, positions=np.array([0, 1, 2], dtype=np.int64),
                slot_mapping=np.array([0, 1, 2], dtype=np.int64), block_tables=np.array([[0]], dtype=np.int32),
                seq_lens=np.array([3], dtype=np.int32), query_start_loc=np.array([0, 3], dtype=np.int32))

    class Step:
        def __init__(self, **kw):
            self.__dict__.update(good, max_seq_len=3, **kw)

    for bad, match in [(dict(positions=np.array([0, 2, 3], dtype=np.int64)), "consecutive"),
                       (dict(slot_mapping=np.array([0, 1, 10**9], dtype=np.int64)), "outside the cache"),
                       (dict(seq_lens=np.array([4], dtype=np.int32)), "ends at 4"),
                       (dict(query_start_loc=np.array([0, 2], dtype=np.int32)), "query_start_loc")]:
        with pytest.raises((ValueError, IndexError), match=match):
            decoder.run_steps(Step(**bad), runner.kv_cache)
    # Bits, not values: the cache is uninitialised memory, and a NaN in it never equals itself.
    assert _same_bits(runner.kv_cache, before)
    tokens = decoder.run_steps(Step(), runner.kv_cache)
    assert tokens.shape == (3,) and not _same_bits(runner.kv_cache, before)
