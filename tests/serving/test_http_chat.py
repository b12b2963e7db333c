"""/v1/chat/completions through the official openai client: the chat template, greedy text equal
streamed, non-streamed and offline; content parts; logprobs; n > 1 streamed; max_completion_tokens."""

from __future__ import annotations

import pytest

from pagedcore.sampling_params import SamplingParams

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
MAX_TOKENS = 5


@pytest.fixture(scope="module")
def greedy(openai_client):
    return openai_client.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0)


def test_greedy_reply_is_the_same_streamed_non_streamed_and_offline(openai_client, offline_llm, greedy):
    choice = greedy.choices[0]
    assert greedy.object == "chat.completion" and greedy.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"
    chunks = list(openai_client.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=MAX_TOKENS,
                                                        temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == choice.message.content
    assert chunks[-1].choices[0].finish_reason == "length"
    offline = offline_llm.chat(MESSAGES, SamplingParams(max_tokens=MAX_TOKENS, temperature=0), use_tqdm=False)
    assert offline[0].outputs[0].text == choice.message.content
    prompt_ids = offline_llm.apply_chat_template(MESSAGES)
    assert greedy.usage.prompt_tokens == len(prompt_ids) and greedy.usage.completion_tokens == MAX_TOKENS


def test_text_content_parts_are_the_same_as_a_string(openai_client, greedy):
    parts = [{"role": "user", "content": [{"type": "text", "text": MESSAGES[0]["content"]}]}]
    out = openai_client.chat.completions.create(model="smol", messages=parts, max_completion_tokens=MAX_TOKENS,
                                                temperature=0)
    assert out.choices[0].message.content == greedy.choices[0].message.content


def test_logprobs_and_top_logprobs(openai_client):
    out = openai_client.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=2, temperature=0,
                                                logprobs=True, top_logprobs=3)
    content = out.choices[0].logprobs.content
    assert len(content) == 2
    assert "".join(t.token for t in content) == out.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 3
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == pytest.approx(t.logprob)
        assert bytes(t.bytes).decode() == t.token


def test_n_streamed_with_a_seed_and_usage(openai_client):
    chunks = list(openai_client.chat.completions.create(
        model="smol", messages=MESSAGES, max_completion_tokens=2, n=2, temperature=1.0, seed=7, stream=True,
        stream_options={"include_usage": True}))
    texts, finish = {0: "", 1: ""}, {}
    for chunk in chunks[:-1]:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert finish == {0: "length", 1: "length"} and all(texts.values())
    assert chunks[-1].usage.completion_tokens == 4
