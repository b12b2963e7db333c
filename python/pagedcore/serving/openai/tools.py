"""Tool calling on /v1/chat/completions: `tools` and `tool_choice` (OpenAI's fields, vLLM's meanings).

    none                 the tools go to the chat template; the reply is text
    required             the reply is constrained to a JSON list of {"name", "parameters"} of the tools;
                         it becomes tool_calls with finish_reason "tool_calls"
    {"type": "function", "function": {"name": F}}
                         the reply is constrained to F's parameters schema; it becomes one call of F
                         (finish_reason "stop", as OpenAI and vLLM answer a forced function)
    auto                 needs a tool-call parser (vLLM's --enable-auto-tool-choice --tool-call-parser
                         hermes); the model decides, and <tool_call>{...}</tool_call> blocks are parsed
parallel_tool_calls false (OpenAI's field; true by default) allows at most one call: "required" constrains
the list to one item, "auto" keeps the first call parsed, a named function is one call anyway.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from pagedcore.sampling_params import StructuredOutputsParams
from pagedcore.serving.openai.errors import bad_request

_ANY_OBJECT = {"type": "object"}
_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
HERMES_START = "<tool_call>"


@dataclass
class ToolPlan:
    """What a chat request's tools do to its prompt, its constraint and its reply."""

    tools: list[dict[str, Any]] | None    # passed to the chat template (None: no tools)
    mode: str                             # "none", "required", "named" or "auto"
    named: str | None = None              # the function of mode "named"
    constraint: StructuredOutputsParams | None = None
    max_calls: int | None = None          # 1 with parallel_tool_calls false; None: any number

    def calls_of(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """A finished reply -> (content, tool_calls in OpenAI's shape). Text the mode cannot read as
        calls stays content (a reply cut by max_tokens, or a model that chose not to call)."""
        if self.mode == "named":
            return None, [_call(self.named, text)]
        if self.mode == "required":
            try:
                items = json.loads(text)
            except ValueError:
                return text, []
            return None, [_call(i["name"], json.dumps(i["parameters"], ensure_ascii=False)) for i in items]
        if self.mode == "auto":
            content, calls = hermes_calls(text)
            return content, calls[:self.max_calls]
        return text, []


def plan_tools(tools: list[Any] | None, tool_choice: Any, auto_parser: str | None,
               parallel_tool_calls: bool | None = None) -> ToolPlan:
    """Checks tools and tool_choice (400s name the field); auto_parser: the server's tool-call parser
    (None when it was started without --enable-auto-tool-choice)."""
    max_calls = 1 if parallel_tool_calls is False else None
    if not tools:
        if tool_choice not in (None, "none"):
            raise bad_request("tool_choice needs tools; send the functions the model may call", "tool_choice")
        return ToolPlan(None, "none")
    functions = {}
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise bad_request(f'tools[{i}] must be {{"type": "function", "function": {{"name": ..., "parameters": '
                              '{...}}}', f"tools.{i}")
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise bad_request(f"tools[{i}].function.name must be a non-empty string", f"tools.{i}.function.name")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise bad_request(f"tools[{i}].function.parameters must be a JSON schema object",
                              f"tools.{i}.function.parameters")
        functions[name] = parameters or _ANY_OBJECT
    if tool_choice is None:
        tool_choice = "auto"      # OpenAI's default when tools are given
    if tool_choice == "none":
        return ToolPlan(tools, "none")
    if tool_choice == "required":
        schema = {"type": "array", "minItems": 1, "items": {"anyOf": [
            {"type": "object", "properties": {"name": {"type": "string", "enum": [name]}, "parameters": params},
             "required": ["name", "parameters"]} for name, params in functions.items()]}}
        if max_calls is not None:
            schema["maxItems"] = max_calls
        return ToolPlan(tools, "required", constraint=StructuredOutputsParams(json=schema), max_calls=max_calls)
    if tool_choice == "auto":
        if auto_parser != "hermes":
            raise bad_request('"auto" tool choice needs a server started with --enable-auto-tool-choice '
                              '--tool-call-parser hermes; or send tool_choice "required", "none" or a named '
                              "function", "tool_choice")
        return ToolPlan(tools, "auto", max_calls=max_calls)
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        if name not in functions:
            raise bad_request(f"tool_choice names the function {name!r}, which is not among the tools "
                              f"({', '.join(functions)})", "tool_choice")
        return ToolPlan(tools, "named", named=name, constraint=StructuredOutputsParams(json=functions[name]))
    raise bad_request('tool_choice must be "none", "auto", "required" or {"type": "function", "function": '
                      f'{{"name": ...}}}}, got {tool_choice!r}', "tool_choice")


def hermes_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Hermes-format text: content, then <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks."""
    start = text.find(HERMES_START)
    if start < 0:
        return text, []
    calls = []
    for block in _HERMES_CALL.findall(text[start:]):
        try:
            item = json.loads(block)
            calls.append(_call(item["name"], json.dumps(item.get("arguments", {}), ensure_ascii=False)))
        except (ValueError, KeyError, TypeError):
            return text, []       # not a call after all: the whole reply is content
    content = text[:start].strip()
    return content or None, calls


def _call(name: str, arguments: str) -> dict[str, Any]:
    return {"id": f"chatcmpl-tool-{uuid.uuid4().hex}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


class ToolStream:
    """One streamed choice of a request with tools: which text goes out as content at once, and the
    calls at the end. Constrained calls (required, named) are sent whole in the last chunk; in auto
    mode content streams until a <tool_call> starts (or may be starting) and the rest waits."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.text = ""
        self.num_sent = 0         # characters of text already sent as content

    def feed(self, delta: str) -> str:
        self.text += delta
        if self.plan.mode in ("required", "named"):
            return ""
        cut = len(self.text)
        if self.plan.mode == "auto":
            found = self.text.find(HERMES_START)
            if found >= 0:
                cut = found
            else:   # hold back a tail that may be the start of "<tool_call>"
                for k in range(min(len(HERMES_START) - 1, len(self.text)), 0, -1):
                    if self.text.endswith(HERMES_START[:k]):
                        cut = len(self.text) - k
                        break
        out = self.text[self.num_sent:cut] if cut > self.num_sent else ""
        self.num_sent = max(self.num_sent, cut)
        return out

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """(content not yet sent, tool calls) once the choice has finished."""
        content, calls = self.plan.calls_of(self.text)
        if calls:
            return "", calls
        rest = self.text[self.num_sent:]
        self.num_sent = len(self.text)
        return rest, []


def finish_reason(plan: ToolPlan, calls: list, reason: str | None) -> str | None:
    """vLLM's rule: "tool_calls" when the model chose to call (auto) or had to (required)."""
    if calls and reason == "stop" and plan.mode in ("required", "auto"):
        return "tool_calls"
    return reason
