"""Multi-step scheduling under random request streams (hypothesis): greedy and seeded sampled requests with
random penalties, logit bias, min_tokens, logprobs, stop ids and lengths arrive at random steps (some are
aborted); every request's tokens, logprobs and finish reason equal a single-step engine's on the same
stream (each of those rows is batch-invariant), and no KV block leaks."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedcore import SamplingParams
from pagedcore.config import EngineConfig
from pagedcore.engine.llm_engine import LLMEngine
from tests.engine.conftest import prompts_with_shared_prefix

PROMPTS = prompts_with_shared_prefix(6, seed=41)


@st.composite
def request(draw):
    sampled = draw(st.booleans())
    edits = {}
    if draw(st.booleans()):
        edits["repetition_penalty"] = draw(st.sampled_from([1.1, 1.3]))
    if draw(st.booleans()):
        edits["frequency_penalty"] = draw(st.sampled_from([0.5, 1.5]))
        edits["presence_penalty"] = draw(st.sampled_from([0.0, 1.0]))
    if draw(st.booleans()):
        edits["logit_bias"] = {draw(st.integers(0, 99)): draw(st.sampled_from([-3.0, 4.0]))}
    stop_ids = draw(st.lists(st.integers(0, 99), max_size=2))
    max_tokens = draw(st.integers(1, 14))
    if stop_ids and draw(st.booleans()):
        edits["min_tokens"] = draw(st.integers(1, max_tokens))
    params = SamplingParams(
        temperature=draw(st.sampled_from([0.7, 1.0])) if sampled else 0.0,
        seed=draw(st.integers(0, 99)) if sampled else None,
        top_p=draw(st.sampled_from([1.0, 0.9])), top_k=draw(st.sampled_from([0, 20])),
        max_tokens=max_tokens, stop_token_ids=stop_ids, ignore_eos=True,
        logprobs=draw(st.sampled_from([None, None, 0, 2])), **edits)
    return draw(st.integers(0, len(PROMPTS) - 1)), params, draw(st.integers(0, 6)), draw(st.booleans())


def drive(folder, steps: int, stream, blocks: int | None):
    """Adds each request at its step, aborts the flagged ones two steps later; (outputs by id, engine)."""
    engine = LLMEngine(EngineConfig(model=str(folder), max_model_len=256, num_scheduler_steps=steps,
                                    block_size=16, num_gpu_blocks_override=blocks))
    done = {}
    for step in range(200):
        for i, (prompt, params, arrival, abort) in enumerate(stream):
            if arrival == step:
                engine.add_request(str(i), prompt_token_ids=PROMPTS[prompt], params=params)
            if abort and arrival + 2 == step:
                engine.abort_request(str(i))
        for out in engine.step():
            if out.finished:
                o = out.outputs[0]
                done[out.request_id] = (o.token_ids, o.logprobs, o.finish_reason)
        if step > 8 and not engine.has_unfinished_requests():
            break
    assert not engine.has_unfinished_requests()
    return done, engine


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=st.lists(request(), min_size=1, max_size=6), tight=st.booleans())
def test_random_streams_give_the_single_steps_outputs(tiny_llama, stream, tight):
    _, folder = tiny_llama
    blocks = 14 if tight else None   # tight: preemption by recompute
    single, _ = drive(folder, 1, stream, blocks)
    multi, engine = drive(folder, 4, stream, blocks)
    kept = [str(i) for i, (_, _, _, abort) in enumerate(stream) if not abort]
    assert {k: multi[k] for k in kept} == {k: single[k] for k in kept}
    stats = engine.scheduler.stats()
    assert stats.num_free_blocks == engine.scheduler.config.num_gpu_blocks
