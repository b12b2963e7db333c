"""/v1/completions through the official openai client: greedy text equal streamed, non-streamed and
offline; n > 1 with a seed; stop strings; logprobs; echo; token and batch prompts; usage."""

from __future__ import annotations

import pytest

from pagedcore.sampling_params import SamplingParams

PROMPT = "The capital of France is"
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def greedy(openai_client):
    return openai_client.completions.create(model="smol", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)


def test_greedy_text_is_the_same_streamed_non_streamed_and_offline(openai_client, offline_llm, greedy):
    choice = greedy.choices[0]
    assert greedy.object == "text_completion" and greedy.model == "smol" and greedy.id.startswith("cmpl-")
    assert choice.finish_reason == "length" and choice.text
    stream = openai_client.completions.create(model="smol", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                              stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert chunks[-1].choices[0].finish_reason == "length"
    offline = offline_llm.generate(PROMPT, SamplingParams(max_tokens=MAX_TOKENS, temperature=0), use_tqdm=False)
    assert offline[0].outputs[0].text == choice.text


def test_usage_counts_tokens(greedy, offline_llm):
    num_prompt = len(offline_llm.get_tokenizer().encode(PROMPT))
    u = greedy.usage
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (num_prompt, MAX_TOKENS, num_prompt + MAX_TOKENS)
    assert u.prompt_tokens_details.cached_tokens >= 0


def test_stop_string_ends_the_text_before_it(openai_client, greedy):
    text = greedy.choices[0].text
    words = text.split()
    if len(words) < 2:
        pytest.skip(f"greedy text {text!r} has no second word to stop at")
    stop = words[1]
    out = openai_client.completions.create(model="smol", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                           stop=[stop])
    choice = out.choices[0]
    assert choice.text == text[:text.index(stop)]
    assert choice.finish_reason == "stop"
    assert choice.model_extra["stop_reason"] == stop


def test_n_samples_with_a_seed_are_reproducible(openai_client):
    def ask():
        return openai_client.completions.create(model="smol", prompt="Once upon a time", max_tokens=3, n=2,
                                                temperature=1.0, seed=1234)
    first, second = ask(), ask()
    assert sorted(c.index for c in first.choices) == [0, 1]
    assert [c.text for c in first.choices] == [c.text for c in second.choices]
    assert first.usage.completion_tokens == 6


def test_logprobs_list_the_greedy_token_first(openai_client):
    out = openai_client.completions.create(model="smol", prompt=PROMPT, max_tokens=3, temperature=0, logprobs=2)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 3
    assert "".join(lp.tokens) == out.choices[0].text
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0 and 1 <= len(top) <= 3
        assert logprob == pytest.approx(max(top.values()))     # greedy picked the most likely token
        assert top[token] == pytest.approx(logprob)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0


def test_echo_puts_the_prompt_first_with_its_logprobs(openai_client, offline_llm):
    out = openai_client.completions.create(model="smol", prompt=PROMPT, max_tokens=1, temperature=0, echo=True,
                                           logprobs=1)
    choice = out.choices[0]
    assert choice.text.startswith(PROMPT) and len(choice.text) > len(PROMPT)
    num_prompt = len(offline_llm.get_tokenizer().encode(PROMPT))
    assert len(choice.logprobs.tokens) == num_prompt + 1
    assert choice.logprobs.token_logprobs[0] is None                   # nothing predicts the first token
    assert all(v <= 0 for v in choice.logprobs.token_logprobs[1:])


def test_token_id_and_batch_prompts(openai_client, offline_llm):
    ids = offline_llm.get_tokenizer().encode(PROMPT)
    by_ids = openai_client.completions.create(model="smol", prompt=ids, max_tokens=2, temperature=0)
    by_text = openai_client.completions.create(model="smol", prompt=PROMPT, max_tokens=2, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    batch = openai_client.completions.create(model="smol", prompt=[PROMPT, "Hello"], max_tokens=2, temperature=0, n=2)
    assert sorted(c.index for c in batch.choices) == [0, 1, 2, 3]
    assert {c.text for c in batch.choices if c.index < 2} == {by_text.choices[0].text}


def test_stream_include_usage_sends_a_last_usage_chunk(openai_client):
    chunks = list(openai_client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=2, temperature=0,
                                                   stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 2
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].model == "smol"   # the first served name, whichever one the client used


def test_a_repeated_prompt_reports_cached_tokens(openai_client, http_server):
    from tests.serving.http_helpers import metric

    prompt = "Here is a list of the planets of the solar system, in order from the sun outwards: " * 16
    hits = metric(http_server.url, "pagedcore:prefix_cache_hits_total")
    first = openai_client.completions.create(model="smol", prompt=prompt, max_tokens=1, temperature=0)
    second = openai_client.completions.create(model="smol", prompt=prompt, max_tokens=1, temperature=0)
    assert first.usage.prompt_tokens >= 256
    # Whole blocks (128 tokens, the CPU default) of the first request's prompt are reused by the second.
    assert second.usage.prompt_tokens_details.cached_tokens >= 128
    assert metric(http_server.url, "pagedcore:prefix_cache_hits_total") >= hits + 128
