"""Bad input of every kind answers 4xx with OpenAI's error object, naming the field; the server keeps
serving. Plus the small routes: /v1/models, /tokenize, /detokenize, /health, /version."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.serving.http_helpers import MAX_BODY_BYTES, MAX_MODEL_LEN, SERVED_NAMES

P = {"model": "smol", "prompt": "Hi"}
M = {"model": "smol", "messages": [{"role": "user", "content": "Hi"}]}

# (route, body, expected param): one bad value per parameter.
BAD = [
    ("/v1/completions", {**P, "temperature": -0.5}, "temperature"),
    ("/v1/completions", {**P, "temperature": "hot"}, "temperature"),
    ("/v1/completions", {**P, "top_p": 0}, "top_p"),
    ("/v1/completions", {**P, "top_p": 1.5}, "top_p"),
    ("/v1/completions", {**P, "top_k": -2}, "top_k"),
    ("/v1/completions", {**P, "min_p": 2}, "min_p"),
    ("/v1/completions", {**P, "n": 0}, "n"),
    ("/v1/completions", {**P, "n": 1000}, "n"),
    ("/v1/completions", {**P, "n": 1.5}, "n"),
    ("/v1/completions", {**P, "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {**P, "max_tokens": MAX_MODEL_LEN}, "max_tokens"),
    ("/v1/completions", {**P, "max_tokens": "ten"}, "max_tokens"),
    ("/v1/completions", {**P, "min_tokens": -1}, "min_tokens"),
    ("/v1/completions", {**P, "min_tokens": 9, "max_tokens": 3}, "min_tokens"),
    ("/v1/completions", {**P, "presence_penalty": 3}, "presence_penalty"),
    ("/v1/completions", {**P, "frequency_penalty": -2.5}, "frequency_penalty"),
    ("/v1/completions", {**P, "repetition_penalty": 0}, "repetition_penalty"),
    ("/v1/completions", {**P, "logit_bias": {"1": 500}}, "logit_bias"),
    ("/v1/completions", {**P, "logit_bias": {"x": 1}}, "logit_bias"),
    ("/v1/completions", {**P, "logit_bias": {"10000000": 1}}, "logit_bias"),
    ("/v1/completions", {**P, "seed": "abc"}, "seed"),
    ("/v1/completions", {**P, "seed": 2**70}, "seed"),
    ("/v1/completions", {**P, "seed": -(2**63) - 1}, "seed"),
    ("/v1/completions", {**P, "temperature": 2.5}, "temperature"),          # OpenAI's range: refused, not clamped
    ("/v1/completions", {**P, "stream_options": {"include_usage": True}}, "stream_options"),   # without stream
    ("/v1/chat/completions", {**M, "stream_options": {"include_usage": True}, "stream": False}, "stream_options"),
    ("/v1/chat/completions", {**M, "logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("/v1/completions", {**P, "stop": 5}, "stop"),
    ("/v1/completions", {**P, "stop": [""]}, "stop"),
    ("/v1/completions", {**P, "stop_token_ids": [-1]}, "stop_token_ids"),
    ("/v1/completions", {**P, "stop_token_ids": [10000000]}, "stop_token_ids"),
    ("/v1/completions", {**P, "logprobs": -1}, "logprobs"),
    ("/v1/completions", {**P, "logprobs": 50}, "logprobs"),
    ("/v1/completions", {**P, "echo": "yes"}, "echo"),
    ("/v1/completions", {**P, "stream": 1}, "stream"),
    ("/v1/completions", {**P, "stream_options": {"include_usage": "y"}}, "stream_options.include_usage"),
    ("/v1/completions", {**P, "ignore_eos": "no"}, "ignore_eos"),
    ("/v1/completions", {**P, "include_stop_str_in_output": 2}, "include_stop_str_in_output"),
    ("/v1/completions", {**P, "skip_special_tokens": "no"}, "skip_special_tokens"),
    ("/v1/completions", {**P, "spaces_between_special_tokens": 0}, "spaces_between_special_tokens"),
    ("/v1/completions", {**P, "priority": 1}, "priority"),
    ("/v1/completions", {**P, "user": 5}, "user"),
    ("/v1/completions", {**P, "best_of": 3}, "best_of"),
    ("/v1/completions", {**P, "suffix": "!"}, "suffix"),
    ("/v1/completions", {**P, "prompt": ""}, "prompt"),
    ("/v1/completions", {**P, "prompt": []}, "prompt"),
    ("/v1/completions", {**P, "prompt": 7}, "prompt"),
    ("/v1/completions", {**P, "prompt": [10000000]}, "prompt"),
    ("/v1/completions", {**P, "prompt": "word " * (MAX_MODEL_LEN + 10)}, "prompt"),
    ("/v1/completions", {"model": "smol"}, "prompt"),
    ("/v1/chat/completions", {**M, "messages": []}, "messages"),
    ("/v1/chat/completions", {**M, "messages": [{"content": "Hi"}]}, "messages.0.role"),
    ("/v1/chat/completions", {**M, "messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ("/v1/chat/completions", {**M, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages.0.content.0.type"),
    ("/v1/chat/completions", {**M, "logprobs": "true"}, "logprobs"),
    ("/v1/chat/completions", {**M, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {**M, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {**M, "max_completion_tokens": 0}, "max_completion_tokens"),
    ("/v1/chat/completions", {**M, "max_completion_tokens": MAX_MODEL_LEN}, "max_completion_tokens"),
    ("/v1/chat/completions", {**M, "max_tokens": -3}, "max_tokens"),
    ("/v1/chat/completions", {**M, "temperature": -1}, "temperature"),
    # "auto" (the default with tools) needs a tool-call parser, which this server was not started with.
    ("/v1/chat/completions", {**M, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice"),
    ("/v1/chat/completions", {**M, "tools": [{"type": "function"}], "tool_choice": "required"}, "tools.0"),
    ("/v1/chat/completions", {**M, "tools": [{"type": "function", "function": {"name": "f"}}],
                              "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ("/v1/chat/completions", {**M, "tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {**M, "response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ("/v1/chat/completions", {**M, "response_format": {"type": "xml"}}, "response_format.type"),
    ("/v1/chat/completions", {**M, "response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex"),
    ("/v1/completions", {**P, "guided_regex": "(ab"}, "guided_regex"),
    ("/v1/completions", {**P, "guided_json": {"type": "objectx"}}, "guided_json"),
    ("/v1/completions", {**P, "guided_json": 5}, "guided_json"),
    ("/v1/completions", {**P, "guided_choice": []}, "guided_choice"),
    ("/v1/completions", {**P, "structured_outputs": {"grammar": "root ::= "}}, "structured_outputs.grammar"),
    ("/v1/completions", {**P, "structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ("/v1/completions", {**P, "structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
    ("/v1/completions", {**P, "guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
    ("/v1/chat/completions", {**M, "continue_final_message": True}, "continue_final_message"),
    ("/tokenize", {"model": "smol"}, "prompt"),
    ("/tokenize", {"model": "smol", "prompt": 5}, "prompt"),
    ("/detokenize", {"model": "smol", "tokens": [-1]}, "tokens"),
    ("/detokenize", {"model": "smol", "tokens": "abc"}, "tokens"),
]


@pytest.fixture(scope="module")
def http(http_server):
    with httpx.Client(base_url=http_server.url, timeout=120) as client:
        yield client


def assert_openai_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if param is not None:
        assert error["param"] == param, error
        assert param.split(".")[0] in error["message"]     # the message names the field too
    return error


@pytest.mark.parametrize("route,body,param", BAD, ids=[f"{r}:{p}:{json.dumps(b)[-40:]}" for r, b, p in BAD])
def test_bad_parameter_is_a_400_naming_the_field(http, route, body, param):
    assert_openai_error(http.post(route, json=body), 400, param)


@pytest.mark.parametrize("content", [b"", b"{not json", b"[1, 2]", b"null", b'"text"'])
def test_malformed_json_is_a_400(http, content):
    response = http.post("/v1/completions", content=content, headers={"Content-Type": "application/json"})
    assert_openai_error(response, 400)


def test_the_length_error_gives_the_numbers(http):
    error = assert_openai_error(http.post("/v1/completions", json={**P, "max_tokens": MAX_MODEL_LEN}), 400)
    assert f"{MAX_MODEL_LEN} tokens" in error["message"] and str(MAX_MODEL_LEN - 1) in error["message"]


def test_unknown_model_is_a_404(openai_client, http):
    with pytest.raises(openai.NotFoundError) as raised:
        openai_client.completions.create(model="gpt-4", prompt="Hi", max_tokens=1)
    assert raised.value.code == "model_not_found"
    assert_openai_error(http.get("/v1/models/gpt-4"), 404)


def test_too_large_a_body_is_a_413(http):
    big = {**P, "prompt": "x" * (MAX_BODY_BYTES + 1)}
    error = assert_openai_error(http.post("/v1/completions", json=big), 413)
    assert "--max-request-body-bytes" in error["message"]


def test_unknown_route_and_method_keep_the_error_shape(http):
    assert_openai_error(http.get("/v1/nothing"), 404)
    assert_openai_error(http.get("/v1/completions"), 405)


def test_the_server_still_serves_after_bad_input(openai_client):
    out = openai_client.completions.create(model="smol", prompt="Hi", max_tokens=1, temperature=0)
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 1


def test_null_fields_mean_their_defaults(http):
    # Many clients send every field, the unset ones as null; api.openai.com accepts that.
    nulls = dict.fromkeys(["n", "stop", "seed", "top_p", "logprobs", "logit_bias", "user", "presence_penalty",
                           "frequency_penalty", "stream", "stream_options", "echo", "top_k", "ignore_eos"])
    response = http.post("/v1/completions", json={**P, **nulls, "max_tokens": 1, "temperature": 0})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 1


def test_models_lists_the_served_names(openai_client):
    models = openai_client.models.list().data
    assert [m.id for m in models] == SERVED_NAMES
    card = models[0].model_extra
    assert card["max_model_len"] == MAX_MODEL_LEN and card["root"].endswith(".gguf")
    assert models[0].owned_by == "pagedcore"
    assert openai_client.models.retrieve("smollm2").id == "smollm2"


def test_tokenize_and_detokenize_round_trip(http):
    tokens = http.post("/tokenize", json={"model": "smol", "prompt": "Hello world", "return_token_strs": True}).json()
    assert tokens["count"] == len(tokens["tokens"]) == len(tokens["token_strs"]) > 0
    assert tokens["max_model_len"] == MAX_MODEL_LEN
    assert http.post("/detokenize", json={"tokens": tokens["tokens"]}).json() == {"prompt": "Hello world"}
    chat = http.post("/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
    assert chat["count"] > 3 and chat["token_strs"] is None


def test_health_and_version(http):
    assert http.get("/health").status_code == 200
    from pagedcore import __version__

    assert http.get("/version").json() == {"version": __version__}


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "Hi"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
])
@pytest.mark.parametrize("stream", [False, True])
def test_unknown_fields_are_named_in_the_answer(http, path, body, stream):
    """A field no model here knows is not silently dropped: the answer names it in a header (a field
    that would change the output and is not supported is a 400 instead: the tests above)."""
    response = http.post(path, json={**body, "max_tokens": 1, "stream": stream, "frobnicate": 1, "zzz_typo": "x"})
    assert response.status_code == 200, response.text
    assert response.headers["pagedcore-ignored-fields"] == "frobnicate, zzz_typo"
    plain = http.post(path, json={**body, "max_tokens": 1, "stream": stream})
    assert "pagedcore-ignored-fields" not in plain.headers
