"""`pagedcore serve --num-scheduler-steps N` (vLLM's flag): streamed and whole completions carry the
offline engine's greedy text, the stream arriving several tokens a chunk, and a seeded sampled
completion the offline single-step engine's sampled text; /metrics counts every token."""

from __future__ import annotations

import httpx
import openai
import pytest

from pagedcore import SamplingParams
from tests.serving.http_helpers import ServerProcess, metric

PROMPTS = ["The sky is", "In 1492,"]
MAX_TOKENS = 9


@pytest.fixture(scope="module")
def multi_step_server():
    server = ServerProcess("--served-model-name", "smol", "--num-scheduler-steps", "4")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def test_streams_carry_the_greedy_text_in_multi_token_chunks(multi_step_server, offline_llm):
    expected = [o.outputs[0].text for o in offline_llm.generate(
        PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True), use_tqdm=False)]
    client = openai.OpenAI(base_url=multi_step_server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    try:
        for prompt, text in zip(PROMPTS, expected):
            whole = client.completions.create(model="smol", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                              extra_body={"ignore_eos": True})
            assert whole.choices[0].text == text and whole.usage.completion_tokens == MAX_TOKENS
            chunks = [c.choices[0].text for c in client.completions.create(
                model="smol", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True,
                extra_body={"ignore_eos": True}) if c.choices]
            assert "".join(chunks) == text
            # 1 token from the prefill step, then steps of up to 4: fewer chunks than tokens.
            assert len([c for c in chunks if c]) < MAX_TOKENS
    finally:
        client.close()
    assert metric(multi_step_server.url, "pagedcore:generation_tokens_total") >= 4 * MAX_TOKENS
    assert httpx.get(multi_step_server.url + "/health").status_code == 200


def test_a_seeded_sampled_completion_equals_the_offline_single_steps(multi_step_server, offline_llm):
    params = SamplingParams(temperature=0.9, top_p=0.9, top_k=40, seed=123, max_tokens=2 * MAX_TOKENS,
                            ignore_eos=True)
    expected = offline_llm.generate([PROMPTS[0]], params, use_tqdm=False)[0].outputs[0].text
    client = openai.OpenAI(base_url=multi_step_server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    try:
        chunks = [c.choices[0].text for c in client.completions.create(
            model="smol", prompt=PROMPTS[0], max_tokens=2 * MAX_TOKENS, temperature=0.9, top_p=0.9, seed=123,
            stream=True, extra_body={"top_k": 40, "ignore_eos": True}) if c.choices]
    finally:
        client.close()
    assert "".join(chunks) == expected
    assert len([c for c in chunks if c]) < 2 * MAX_TOKENS   # it rode multi-steps


def test_streamed_logprobs_equal_the_offline_single_steps(multi_step_server, offline_llm):
    """logprobs=2 through multi-steps: every streamed token carries the single steps' logprob, in chunks."""
    expected = offline_llm.generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=2 * MAX_TOKENS, logprobs=2,
                                                                 ignore_eos=True), use_tqdm=False)[0].outputs[0]
    client = openai.OpenAI(base_url=multi_step_server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    try:
        chunks = [c.choices[0] for c in client.completions.create(
            model="smol", prompt=PROMPTS[1], max_tokens=2 * MAX_TOKENS, temperature=0, logprobs=2, stream=True,
            extra_body={"ignore_eos": True}) if c.choices]
    finally:
        client.close()
    got = [v for c in chunks if c.logprobs for v in c.logprobs.token_logprobs]
    want = [entry[token].logprob for token, entry in zip(expected.token_ids, expected.logprobs)]
    assert got == pytest.approx(want, abs=1e-6) and len(got) == 2 * MAX_TOKENS
    assert len([c for c in chunks if c.text]) < 2 * MAX_TOKENS   # several tokens a chunk: multi-steps ran
