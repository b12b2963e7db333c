"""Drafted / accepted counts reach the step record and the Prometheus counters (vLLM's names)."""

from __future__ import annotations

from pagedcore import LLM, SamplingParams
from pagedcore.serving.metrics import ServerMetrics
from tests.engine.conftest import prompts_with_shared_prefix
from tests.models import tiny_models


def test_step_record_and_counters_agree_with_the_stats(tiny_llama, oracle):
    hf_model, folder = tiny_llama
    from tests.engine.conftest import hf_greedy
    prompts = prompts_with_shared_prefix(3, seed=9)
    expected = [hf_greedy(hf_model, p, 20) for p in prompts]
    oracle(prompts, expected, tiny_models.VOCAB_SIZE)
    llm = LLM(folder, max_model_len=256, speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                                             "backoff_after_misses": 0})
    engine = llm.llm_engine
    metrics = ServerMetrics("tiny", lambda: None, 256)
    records = []
    engine.step_listeners.append(lambda out, result, timing: records.append(dict(timing)))
    engine.step_listeners.append(lambda out, result, timing: metrics.on_step([], timing))
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected
    stats = engine.speculator.stats
    assert stats.num_drafts > 0 and stats.num_accepted_tokens > 0
    assert sum(r["num_draft_tokens"] for r in records) == stats.num_draft_tokens
    assert sum(r["num_accepted_tokens"] for r in records) == stats.num_accepted_tokens
    assert sum(r["num_drafts"] for r in records) == stats.num_drafts
    text = metrics.render().decode()
    assert f'pagedcore:spec_decode_num_drafts_total{{model_name="tiny"}} {float(stats.num_drafts)}' in text
    assert f'pagedcore:spec_decode_num_draft_tokens_total{{model_name="tiny"}} {float(stats.num_draft_tokens)}' in text
    assert (f'pagedcore:spec_decode_num_accepted_tokens_total{{model_name="tiny"}} '
            f'{float(stats.num_accepted_tokens)}') in text
    for pos, n in enumerate(stats.accepted_per_pos):
        line = f'pagedcore:spec_decode_num_accepted_tokens_per_pos_total{{model_name="tiny",position="{pos}"}} {float(n)}'
        assert line in text or n == 0
    # Tokens per step: more than one for some sequence-steps (that is the point).
    assert stats.mean_accepted_length > 1
