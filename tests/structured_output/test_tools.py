"""Tool calling's request side and reply parsing (serving/openai/tools.py), without a server."""

from __future__ import annotations

import json

import pytest

from pagedcore.serving.openai.errors import APIError
from pagedcore.serving.openai.tools import ToolStream, finish_reason, hermes_calls, plan_tools
from pagedcore.structured_output.compiler import GrammarCache, new_matcher
from tests.models import tiny_models

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


def test_none_keeps_text_and_passes_the_tools_to_the_template():
    plan = plan_tools([WEATHER], "none", None)
    assert plan.tools == [WEATHER] and plan.constraint is None
    assert plan.calls_of("hello") == ("hello", [])
    assert plan_tools(None, None, None).tools is None


def test_required_constrains_to_a_list_of_calls_and_parses_them():
    plan = plan_tools([WEATHER, TIME], "required", None)
    grammar = GrammarCache(tiny_models.make_tokenizer(), tiny_models.VOCAB_SIZE, [2]).compile(plan.constraint)
    reply = '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {}}]'
    matcher = new_matcher(grammar)
    assert matcher.accept_string(reply) and matcher.is_completed()
    assert not new_matcher(grammar).accept_string('[{"name": "get_weather", "parameters": {}}]')  # city required
    assert not new_matcher(grammar).accept_string("[]")
    content, calls = plan.calls_of(reply)
    assert content is None and [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert calls[0]["type"] == "function" and calls[0]["id"] != calls[1]["id"]
    assert finish_reason(plan, calls, "stop") == "tool_calls"
    assert plan.calls_of('[{"name": "get_wea') == ('[{"name": "get_wea', [])   # cut by max_tokens


def test_named_function_constrains_to_its_parameters():
    plan = plan_tools([WEATHER, TIME], {"type": "function", "function": {"name": "get_weather"}}, None)
    assert plan.constraint.json == WEATHER["function"]["parameters"]
    content, calls = plan.calls_of('{"city": "Rome"}')
    assert content is None and calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Rome"}'}
    assert finish_reason(plan, calls, "stop") == "stop"      # OpenAI's and vLLM's answer to a forced call


@pytest.mark.parametrize("tools,choice,param", [
    ([WEATHER], "auto", "tool_choice"), ([WEATHER], None, "tool_choice"),
    (None, "required", "tool_choice"), ([{"type": "function"}], "none", "tools.0"),
    ([{"type": "function", "function": {"name": ""}}], "none", "tools.0.function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], "none", "tools.0.function.parameters"),
    ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
    ([WEATHER], "sometimes", "tool_choice"),
])
def test_refusals_name_the_field(tools, choice, param):
    with pytest.raises(APIError) as refused:
        plan_tools(tools, choice, None)
    assert refused.value.status == 400 and refused.value.param == param


def test_hermes_parsing():
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    content, calls = hermes_calls(text)
    assert content == "Let me check." and calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    assert hermes_calls("no calls here") == ("no calls here", [])
    assert hermes_calls("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])
    plan = plan_tools([WEATHER], "auto", "hermes")
    assert plan.constraint is None and finish_reason(plan, calls, "stop") == "tool_calls"


def test_auto_stream_holds_back_what_may_be_a_call():
    stream = ToolStream(plan_tools([WEATHER], "auto", "hermes"))
    pieces = ["Sure", ", one moment <tool", "_call>{\"name\": \"get_weather\", ", "\"arguments\": {}}</tool_call>"]
    sent = [stream.feed(p) for p in pieces]
    assert "".join(sent) == "Sure, one moment "
    rest, calls = stream.finish()
    assert rest == "" and calls[0]["function"]["name"] == "get_weather"
    plain = ToolStream(plan_tools([WEATHER], "auto", "hermes"))
    assert plain.feed("a <") == "a " and plain.feed("b") == "<b"
    assert plain.finish() == ("", [])


def test_constrained_stream_sends_the_calls_at_the_end():
    stream = ToolStream(plan_tools([WEATHER], "required", None))
    assert stream.feed('[{"name": "get_weather", ') == ""
    assert stream.feed('"parameters": {"city": "Paris"}}]') == ""
    rest, calls = stream.finish()
    assert rest == "" and len(calls) == 1


def test_parallel_tool_calls_false_allows_one_call():
    plan = plan_tools([WEATHER, TIME], "required", None, parallel_tool_calls=False)
    assert plan.constraint.json["maxItems"] == 1 and plan.max_calls == 1
    grammar = GrammarCache(tiny_models.make_tokenizer(), tiny_models.VOCAB_SIZE, [2]).compile(plan.constraint)
    one = '[{"name": "get_time", "parameters": {}}]'
    assert new_matcher(grammar).accept_string(one)
    assert not new_matcher(grammar).accept_string(one[:-1] + ', {"name": "get_time", "parameters": {}}]')
    assert "maxItems" not in plan_tools([WEATHER], "required", None, parallel_tool_calls=True).constraint.json
    auto = plan_tools([WEATHER], "auto", "hermes", parallel_tool_calls=False)
    two = '<tool_call>{"name": "get_weather", "arguments": {"city": "A"}}</tool_call>' * 2
    assert len(auto.calls_of(two)[1]) == 1 and len(plan_tools([WEATHER], "auto", "hermes").calls_of(two)[1]) == 2
