"""The offline API under constraints, on a tiny random Llama: every output follows its constraint
(JSON schema, regex, choice, grammar), with n > 1, seeds, logprobs, preemption and prefix caching,
and unconstrained neighbours in the same batch are left exactly as they were."""

from __future__ import annotations

import json
import re

import pytest

from pagedcore import LLM, SamplingParams
from pagedcore.sampling_params import StructuredOutputsParams as S
from tests.structured_output.schema_check import schema_errors

PROMPTS = ["The quick brown", "over the lazy dog. The", "fox jumps", "The lazy"]
SCHEMA = {
    "type": "object",
    "properties": {
        "animal": {"type": "string", "enum": ["fox", "dog", "lazy dog"]},
        "quick": {"type": "boolean"},
        "legs": {"type": "integer", "minimum": 0, "maximum": 8},
        "tags": {"type": "array", "items": {"enum": ["brown", "lazy"]}, "maxItems": 2},
    },
    "required": ["animal", "quick", "legs", "tags"],
}
REGEX = r"[a-z]{2,5}-\d{2}"
GRAMMAR = 'root ::= "yes" | "no" | "maybe " [0-9]'


def constrained(constraint: S, **kwargs) -> SamplingParams:
    return SamplingParams(**{"temperature": 0, "max_tokens": 80, **kwargs}, structured_outputs=constraint)


def assert_follows(text: str, constraint: S):
    if constraint.json is not None:
        schema = json.loads(constraint.json) if isinstance(constraint.json, str) else constraint.json
        assert schema_errors(json.loads(text), schema) == [], text
    elif constraint.json_object:
        assert isinstance(json.loads(text), dict), text
    elif constraint.regex is not None:
        assert re.fullmatch(constraint.regex, text), text
    elif constraint.choice is not None:
        assert text in constraint.choice
    else:
        assert text in ("yes", "no") or re.fullmatch(r"maybe [0-9]", text), text


CONSTRAINTS = {
    "json": S(json=SCHEMA, disable_any_whitespace=True),
    "json_text_schema": S(json=json.dumps(SCHEMA), disable_any_whitespace=True),
    "regex": S(regex=REGEX),
    "choice": S(choice=["quick fox", "lazy dog", "jumps"]),
    "grammar": S(grammar=GRAMMAR),
}


@pytest.mark.parametrize("name", list(CONSTRAINTS))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_output_follows_its_constraint(tiny_llm, name, temperature):
    constraint = CONSTRAINTS[name]
    outputs = tiny_llm.generate(PROMPTS, constrained(constraint, temperature=temperature, seed=11), use_tqdm=False)
    for out in outputs:
        c = out.outputs[0]
        assert c.finish_reason == "stop", (c.text, c.finish_reason)
        assert_follows(c.text, constraint)


def test_json_object_is_an_object(tiny_llm):
    # Random weights may write an endless string; what is written is still the start of an object.
    out = tiny_llm.generate(PROMPTS[0], constrained(S(json_object=True, disable_any_whitespace=True)),
                            use_tqdm=False)[0].outputs[0]
    assert out.text.startswith("{")
    if out.finish_reason == "stop":
        assert isinstance(json.loads(out.text), dict)


def test_n_samples_each_follow_the_constraint_and_seeds_replay(tiny_llm):
    params = constrained(S(regex=REGEX), n=4, temperature=1.0, seed=5)
    first = tiny_llm.generate(PROMPTS[:2], params, use_tqdm=False)
    again = tiny_llm.generate(PROMPTS[:2], params, use_tqdm=False)
    for out, out_again in zip(first, again):
        texts = [c.text for c in out.outputs]
        assert len(texts) == 4 and len(set(texts)) > 1      # each sample its own matcher and draw
        for c in out.outputs:
            assert c.finish_reason == "stop"
            assert_follows(c.text, S(regex=REGEX))
        assert texts == [c.text for c in out_again.outputs]


def test_logprobs_describe_the_masked_distribution(tiny_llm):
    # Only "a" or "b" can start the output: every other token has logprob -inf, the two share all
    # the mass, and the EOS that follows is certain.
    out = tiny_llm.generate(PROMPTS[0], constrained(S(regex="[ab]"), logprobs=5, temperature=1.0, seed=1),
                            use_tqdm=False)[0].outputs[0]
    assert out.text in ("a", "b") and len(out.logprobs) == 2
    first = out.logprobs[0]
    finite = {t: lp.logprob for t, lp in first.items() if lp.logprob != float("-inf")}
    assert {tiny_llm.get_tokenizer().decode([t]) for t in finite} <= {"a", "b"}
    assert sum(2.718281828459045 ** v for v in finite.values()) == pytest.approx(1.0, abs=1e-4)
    eos = out.token_ids[1]
    assert out.logprobs[1][eos].logprob == pytest.approx(0.0, abs=1e-5)


def test_unconstrained_neighbours_are_unaffected(tiny_llm):
    plain = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    alone = tiny_llm.generate(PROMPTS[:2], plain, use_tqdm=False)
    mixed = tiny_llm.generate(
        [PROMPTS[0], PROMPTS[2], PROMPTS[1], PROMPTS[3]],
        [plain, constrained(CONSTRAINTS["json"]), plain, constrained(S(regex=REGEX), temperature=1.0, seed=3)],
        use_tqdm=False)
    assert mixed[0].outputs[0].token_ids == alone[0].outputs[0].token_ids
    assert mixed[2].outputs[0].token_ids == alone[1].outputs[0].token_ids
    assert_follows(mixed[1].outputs[0].text, CONSTRAINTS["json"])


def test_a_finished_grammar_ends_the_sequence_even_with_ignore_eos(tiny_llm):
    out = tiny_llm.generate(PROMPTS[0], constrained(S(choice=["jumps"]), ignore_eos=True, max_tokens=30),
                            use_tqdm=False)[0].outputs[0]
    assert out.text == "jumps" and out.finish_reason == "stop"
    assert len(out.token_ids) < 30      # ended by the grammar (its EOS), not by max_tokens


def test_unconstrained_steps_never_touch_the_grammar_stage(tiny_llm, monkeypatch):
    processor = tiny_llm.llm_engine.output_processor

    def fail(*args, **kwargs):
        raise AssertionError("the grammar stage ran for an unconstrained batch")

    monkeypatch.setattr(processor.grammar_bitmask, "fill", fail)
    monkeypatch.setattr(processor, "_advance_grammar", fail)
    tiny_llm.generate(PROMPTS, SamplingParams(temperature=0.5, max_tokens=4, logprobs=1), use_tqdm=False)


def test_a_bad_constraint_is_a_value_error_and_the_engine_carries_on(tiny_llm):
    with pytest.raises(ValueError, match=r"structured_outputs.regex could not be compiled: .*parenthesis"):
        tiny_llm.generate(PROMPTS, constrained(S(regex="(ab")), use_tqdm=False)
    assert not tiny_llm.llm_engine.has_unfinished_requests()
    out = tiny_llm.generate(PROMPTS[0], constrained(S(regex=REGEX)), use_tqdm=False)[0].outputs[0]
    assert_follows(out.text, S(regex=REGEX))


@pytest.mark.parametrize("setting", [
    dict(num_gpu_blocks_override=10, max_num_batched_tokens=64),
    dict(num_gpu_blocks_override=10, max_num_batched_tokens=64, preemption_mode="swap", swap_space="64MiB"),
])
def test_matchers_survive_preemption(tiny_folder, setting):
    # Long fixed-length outputs on a KV cache too small for all of them at once: sequences get
    # preempted mid-grammar and must resume where their matcher stands.
    long_regex = S(regex=r"[a-z ]{40}")
    params = [constrained(long_regex, max_tokens=60), constrained(S(regex=REGEX), temperature=1.0, seed=9)] * 3
    prompts = [p + " the" for p in PROMPTS] + PROMPTS[:2]
    reference = LLM(tiny_folder, max_model_len=128, kv_cache_memory="64MiB").generate(prompts, params, use_tqdm=False)
    llm = LLM(tiny_folder, max_model_len=128, block_size=8, **setting)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.llm_engine.scheduler.stats().num_preemptions > 0, "the setting was meant to force preemption"
    for out, ref, p in zip(outputs, reference, params):
        assert out.outputs[0].finish_reason == "stop"
        assert_follows(out.outputs[0].text, p.structured_outputs)
        assert out.outputs[0].token_ids == ref.outputs[0].token_ids


def test_prefix_cache_hits_give_the_same_constrained_output(tiny_folder):
    params = constrained(CONSTRAINTS["json"])
    prompt = PROMPTS[1] * 3                       # several full blocks to reuse (of 16 tokens)
    tiny_llm = LLM(tiny_folder, kv_cache_memory="64MiB", max_model_len=256, block_size=16)
    first = tiny_llm.generate(prompt, params, use_tqdm=False)[0]
    second = tiny_llm.generate(prompt, params, use_tqdm=False)[0]
    assert second.metrics.num_cached_tokens > 0
    assert second.outputs[0].token_ids == first.outputs[0].token_ids
    assert_follows(second.outputs[0].text, CONSTRAINTS["json"])


def test_an_early_mask_fill_changes_no_output(tiny_llm, monkeypatch):
    # The bitmask filled on a worker thread during the forward (forced on: this machine may have no
    # spare core) must give exactly the tokens of the fill after it: n > 1 children (filled late),
    # seeds, several constraints and unconstrained rows in one batch.
    bitmask = tiny_llm.llm_engine.output_processor.grammar_bitmask
    prompts = PROMPTS + PROMPTS[:2]
    params = [constrained(CONSTRAINTS["json"]), constrained(S(regex=REGEX), n=3, temperature=1.0, seed=4),
              SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
              constrained(CONSTRAINTS["choice"], temperature=1.0, seed=8),
              constrained(CONSTRAINTS["grammar"], logprobs=2), constrained(S(json_object=True), max_tokens=20)]
    calls = []
    start = bitmask.start_early_fill
    monkeypatch.setattr(bitmask, "start_early_fill", lambda matchers: calls.append(len(matchers)) or start(matchers))
    try:
        bitmask.overlap = False
        late = tiny_llm.generate(prompts, params, use_tqdm=False)
        assert not calls
        bitmask.overlap = True
        early = tiny_llm.generate(prompts, params, use_tqdm=False)
    finally:
        bitmask.overlap = None                  # back to deciding per step
    assert calls and max(calls) >= 5
    for a, b in zip(late, early):
        assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]


def test_speculative_neighbours_leave_constrained_outputs_unchanged(tiny_folder, tiny_llm):
    # With n-gram speculation on, constrained sequences are never drafted for (a rejected draft must
    # not reach a matcher): they decode one token per step beside drafting neighbours, and every
    # output, constrained or not, equals the engine's without speculation.
    repetitive = "the lazy dog the lazy dog the lazy dog the lazy"      # n-gram drafts find matches
    prompts = [repetitive, PROMPTS[2], repetitive + " dog", PROMPTS[3]]
    params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), constrained(CONSTRAINTS["json"]),
              SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
              constrained(S(regex=REGEX), temperature=1.0, seed=6)]
    reference = tiny_llm.generate(prompts, params, use_tqdm=False)
    llm = LLM(tiny_folder, kv_cache_memory="64MiB", max_model_len=256,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.llm_engine.speculator.stats.num_draft_tokens > 0, "the prompts were meant to draw drafts"
    for out, ref in zip(outputs, reference):
        assert out.outputs[0].token_ids == ref.outputs[0].token_ids
    assert_follows(outputs[1].outputs[0].text, CONSTRAINTS["json"])
    assert_follows(outputs[3].outputs[0].text, S(regex=REGEX))
