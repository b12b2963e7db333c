"""Beam search inside the engine: beside ordinary requests, under preemption and chunked prefill
(beams whose siblings were not sampled are parked and re-enter later), aborts, and bad input."""

from __future__ import annotations

import pytest

from pagedcore import LLM, SamplingParams
from pagedcore.sampling_params import BeamSearchParams

from .conftest import held_prompts

MAX_TOKENS = 12


def run_engine(engine, requests):
    """requests: (request_id, prompt token ids, params) -> {request_id: final RequestOutput}."""
    for request_id, prompt, params in requests:
        engine.add_request(request_id, prompt_token_ids=prompt, params=params, output_kind="final")
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return done


def beams_of(out):
    return [(c.token_ids, c.cumulative_logprob, c.finish_reason) for c in out.outputs]


def assert_same(got, expected):
    assert [b[0] for b in got] == [b[0] for b in expected]
    assert [b[2] for b in got] == [b[2] for b in expected]
    for (_, a, _), (_, b, _) in zip(got, expected):
        assert a == pytest.approx(b, abs=1e-4)


def assert_nothing_leaked(llm):
    engine = llm.llm_engine
    stats = engine.scheduler.stats()
    assert stats.num_free_blocks == engine.scheduler.config.num_gpu_blocks
    assert len(engine.beam_search) == 0 and len(engine.registry) == 0
    assert stats.num_running == stats.num_waiting == stats.num_swapped == 0


@pytest.fixture(scope="module")
def alone(tiny_llama_eos):
    """Each request run by itself on a roomy engine: what every mixed or squeezed run must give."""
    _, folder, _ = tiny_llama_eos
    llm = LLM(folder, max_model_len=256)
    prompts = held_prompts(4, seed=11)
    beams = {}
    for i, p in enumerate(prompts[:2]):
        for width in (2, 4):
            out = run_engine(llm.llm_engine, [("b", p, BeamSearchParams(beam_width=width, max_tokens=MAX_TOKENS))])
            beams[(i, width)] = beams_of(out["b"])
    greedy = {}
    for i, p in enumerate(prompts):
        out = run_engine(llm.llm_engine, [("g", p, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))])
        greedy[i] = out["g"].outputs[0].token_ids
    return prompts, beams, greedy


SETTINGS = {
    "default": dict(),
    "no_prefix_caching": dict(enable_prefix_caching=False),
    "chunked_prefill": dict(max_num_batched_tokens=16),
    "few_seqs": dict(max_num_seqs=5, block_size=8),
    "preempt_recompute": dict(block_size=16, num_gpu_blocks_override=12, max_num_batched_tokens=64),
    "preempt_swap": dict(block_size=16, num_gpu_blocks_override=12, max_num_batched_tokens=64, preemption_mode="swap",
                         swap_space="64MiB"),
}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_beams_beside_other_requests(tiny_llama_eos, alone, setting):
    """Two beam requests (W=2, W=4) and four greedy ones share every step: each gives what it gives alone."""
    _, folder, _ = tiny_llama_eos
    prompts, beams, greedy = alone
    llm = LLM(folder, max_model_len=256, **SETTINGS[setting])
    requests = [(f"g{i}", p, SamplingParams(temperature=0, max_tokens=MAX_TOKENS)) for i, p in enumerate(prompts)]
    # The beams arrive last: preemption (latest arrival first) then falls on them.
    requests += [("b0", prompts[0], BeamSearchParams(beam_width=4, max_tokens=MAX_TOKENS)),
                 ("b1", prompts[1], BeamSearchParams(beam_width=2, max_tokens=MAX_TOKENS))]
    done = run_engine(llm.llm_engine, requests)
    assert_same(beams_of(done["b0"]), beams[(0, 4)])
    assert_same(beams_of(done["b1"]), beams[(1, 2)])
    for i in range(len(prompts)):
        assert done[f"g{i}"].outputs[0].token_ids == greedy[i]
    stats = llm.llm_engine.scheduler.stats()
    if setting.startswith("preempt"):
        assert stats.num_preemptions > 0, "the setting was meant to force preemption"
        assert llm.llm_engine.beam_search.num_parked > 0, "a preempted beam was meant to park its siblings"
    assert_nothing_leaked(llm)


def test_abort_frees_every_beam(tiny_llama):
    _, folder = tiny_llama
    llm = LLM(folder, max_model_len=256)
    engine = llm.llm_engine
    prompt = held_prompts()[0]
    engine.add_request("b", prompt_token_ids=prompt, params=BeamSearchParams(beam_width=4, max_tokens=40))
    engine.add_request("g", prompt_token_ids=prompt, params=SamplingParams(temperature=0, max_tokens=5))
    for _ in range(4):
        engine.step()
    assert len(engine.registry.get_request("b").seqs) == 4
    final = engine.abort_request("b")
    assert final is not None and final.request_id == "b"
    while engine.has_unfinished_requests():
        engine.step()
    assert_nothing_leaked(llm)


def test_returns_beam_width_beams_in_order(tiny_llama):
    _, folder = tiny_llama
    llm = LLM(folder, max_model_len=256)
    prompt = held_prompts()[2]
    (out,) = llm.beam_search([prompt], BeamSearchParams(beam_width=3, max_tokens=5, length_penalty=0.0))
    assert len(out.sequences) == 3
    scores = [s.cum_logprob for s in out.sequences]           # length_penalty 0: the score is the sum
    assert scores == sorted(scores, reverse=True)
    assert len({tuple(s.tokens) for s in out.sequences}) == 3
    for s in out.sequences:
        assert s.cum_logprob == pytest.approx(sum(e[t].logprob for t, e in zip(s.tokens[len(prompt):], s.logprobs)),
                                              abs=1e-4)
        assert s.text == llm.get_tokenizer().decode(s.tokens, skip_special_tokens=True)


@pytest.mark.parametrize("make, field", [
    (lambda: BeamSearchParams(beam_width=0, max_tokens=4), "beam_width"),
    (lambda: BeamSearchParams(beam_width=2, max_tokens=0), "max_tokens"),
    (lambda: BeamSearchParams(beam_width=2, max_tokens=4, early_stopping="sometimes"), "early_stopping"),
    (lambda: BeamSearchParams(beam_width=2, max_tokens=4, length_penalty=float("nan")), "length_penalty"),
])
def test_bad_params_name_the_field(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_bad_requests_are_refused_and_the_engine_runs_on(tiny_llama):
    _, folder = tiny_llama
    llm = LLM(folder, max_model_len=256, max_num_seqs=4)
    prompt = held_prompts()[0]
    with pytest.raises(ValueError, match="beam_width=5 .*max_num_seqs=4"):
        llm.beam_search([prompt], BeamSearchParams(beam_width=5, max_tokens=4))
    with pytest.raises(ValueError, match="temperature must be 0"):
        llm.beam_search([prompt], BeamSearchParams(beam_width=2, max_tokens=4, temperature=0.7))
    with pytest.raises(ValueError, match="lora_request"):
        llm.beam_search([prompt], BeamSearchParams(beam_width=2, max_tokens=4), lora_request=object())
    with pytest.raises(ValueError, match="LoRA adapter"):
        llm.llm_engine.add_request("x", prompt_token_ids=prompt, params=BeamSearchParams(beam_width=2, max_tokens=4),
                                   lora_request=object())
    with pytest.raises(ValueError, match="prompt token ids"):
        llm.beam_search([[600]], BeamSearchParams(beam_width=2, max_tokens=4))
    assert len(llm.llm_engine.registry) == 0
    (out,) = llm.beam_search([prompt], BeamSearchParams(beam_width=2, max_tokens=4))
    assert len(out.sequences) == 2
    assert_nothing_leaked(llm)


def test_refused_on_an_engine_that_speculates(tiny_llama):
    """Drafts and beams do not share a step: beam search on a speculating engine is refused up front."""
    llm = LLM(tiny_llama[1], max_model_len=256,
              speculative_config={"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3})
    with pytest.raises(ValueError, match="speculative"):
        llm.beam_search([held_prompts()[0]], BeamSearchParams(beam_width=2, max_tokens=4))
    assert len(llm.llm_engine.registry) == 0
