"""Beam search over HTTP: vLLM's extra fields (use_beam_search, n = beam width, length_penalty,
early_stopping) on /v1/completions and /v1/chat/completions, held to the offline LLM.beam_search, and
every field beam search cannot honour refused with a 400 naming it. A real `pagedcore serve` on the
tiny model (the one whose EOS ends hypotheses inside the window)."""

from __future__ import annotations

import httpx
import pytest

from pagedcore import LLM
from pagedcore.sampling_params import BeamSearchParams

from tests.serving.http_helpers import ServerProcess

from .conftest import held_prompts

MAX_NUM_SEQS = 8


@pytest.fixture(scope="module")
def server(tiny_llama_eos):
    proc = ServerProcess("--model", tiny_llama_eos[1], "--max-num-seqs", str(MAX_NUM_SEQS), "--max-model-len", "256")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=300) as client:
        yield client


@pytest.fixture(scope="module")
def offline(tiny_llama_eos):
    return LLM(tiny_llama_eos[1], max_model_len=256, dtype="float32")


def test_completions_return_the_beams(http, offline):
    prompts = held_prompts()[:2]
    body = {"prompt": prompts, "use_beam_search": True, "n": 4, "max_tokens": 12, "length_penalty": 0.5,
            "temperature": 0}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    expected = offline.beam_search([{"prompt_token_ids": p} for p in prompts],
                                   BeamSearchParams(beam_width=4, max_tokens=12, length_penalty=0.5))
    tokenizer = offline.get_tokenizer()
    assert [c["index"] for c in choices] == list(range(8))
    for i, out in enumerate(expected):
        for j, seq in enumerate(out.sequences):
            generated = seq.tokens[len(prompts[i]):]
            if seq.finish_reason == "stop":
                generated = generated[:-1]
            choice = choices[i * 4 + j]
            assert choice["text"] == tokenizer.decode(generated, skip_special_tokens=True)
            assert choice["finish_reason"] == seq.finish_reason
    assert response.json()["usage"]["completion_tokens"] == sum(
        len(s.tokens) - len(p) for p, out in zip(prompts, expected) for s in out.sequences)


def test_chat_returns_the_beams_beside_a_sampled_request(http, offline):
    messages = [{"role": "user", "content": "The quick brown fox"}]
    beam = http.post("/v1/chat/completions", json={"messages": messages, "use_beam_search": True, "n": 2,
                                                   "max_tokens": 8, "early_stopping": True})
    sampled = http.post("/v1/chat/completions", json={"messages": messages, "n": 2, "max_tokens": 8, "seed": 1})
    assert beam.status_code == 200, beam.text
    assert sampled.status_code == 200, sampled.text
    (expected,) = offline.beam_search([offline.apply_chat_template(messages)],
                                      BeamSearchParams(beam_width=2, max_tokens=8, early_stopping=True))
    choices = beam.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert len(sampled.json()["choices"]) == 2
    for choice, seq in zip(choices, expected.sequences):
        assert choice["finish_reason"] == seq.finish_reason


@pytest.mark.parametrize("route, extra, param", [
    ("/v1/completions", {"stream": True}, "stream"),
    ("/v1/chat/completions", {"stream": True}, "stream"),
    ("/v1/completions", {"logprobs": 2}, "logprobs"),
    ("/v1/chat/completions", {"logprobs": True}, "logprobs"),
    ("/v1/completions", {"temperature": 0.8}, "temperature"),
    ("/v1/completions", {"top_p": 0.9}, "top_p"),
    ("/v1/completions", {"presence_penalty": 0.5}, "presence_penalty"),
    ("/v1/completions", {"stop": ["x"]}, "stop"),
    ("/v1/completions", {"min_tokens": 2}, "min_tokens"),
    ("/v1/completions", {"n": MAX_NUM_SEQS + 1}, "n"),
    ("/v1/completions", {"n": 0}, "n"),
    ("/v1/completions", {"best_of": 5}, "best_of"),
    ("/v1/completions", {"early_stopping": "sometimes"}, "early_stopping"),
    ("/v1/completions", {"length_penalty": "long"}, "length_penalty"),
    ("/v1/completions", {"structured_outputs": {"regex": "[ab]+"}}, "structured_outputs"),
])
def test_what_beam_search_cannot_honour_is_a_400_naming_it(http, route, extra, param):
    body = {"use_beam_search": True, "n": 2, "max_tokens": 4, **extra}
    if route == "/v1/completions":
        body["prompt"] = "The quick brown fox"
    else:
        body["messages"] = [{"role": "user", "content": "The quick brown fox"}]
    response = http.post(route, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    # The server runs on: an ordinary request still works.
    ok = http.post("/v1/completions", json={"prompt": "The quick", "max_tokens": 2})
    assert ok.status_code == 200, ok.text


def test_fields_at_their_neutral_values_are_accepted(http):
    """Clients that send every field at its default (top_p 1, top_k -1, no stop, ...) are not refused."""
    body = {"prompt": "The quick brown fox", "use_beam_search": True, "n": 2, "max_tokens": 3, "top_p": 1.0,
            "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "stop": [],
            "stop_token_ids": [], "min_tokens": 0, "temperature": 0.0, "best_of": 2, "logprobs": None}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"]) == 2
