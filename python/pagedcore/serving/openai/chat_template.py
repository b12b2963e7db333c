"""Chat messages -> prompt token ids through a Jinja chat template (the model's, --chat-template's, or
the request's), with OpenAI's content parts flattened to text."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jinja2

from pagedcore.serving.openai.errors import bad_request
from pagedcore.serving.openai.protocol import ChatMessage


def load_chat_template(value: str | None) -> str | None:
    """--chat-template: a file path, or the Jinja text itself."""
    if value is None:
        return None
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{{" in value or "{%" in value:
        return value
    raise ValueError(f"--chat-template {value!r} is neither a file nor a Jinja template; give the path of a "
                     ".jinja file or the template text")


def message_dicts(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """The plain dicts templates expect. Content parts of type text are joined with newlines (vLLM's
    rule); other part types need a modality this server does not have."""
    out = []
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if part.type != "text":
                    raise bad_request(f"messages[{i}].content[{j}] has type {part.type!r}; this server serves a "
                                      "text-only model, so send parts of type 'text'", f"messages.{i}.content.{j}.type")
                if part.text is None:
                    raise bad_request(f"messages[{i}].content[{j}] of type 'text' needs a 'text' string",
                                      f"messages.{i}.content.{j}.text")
                texts.append(part.text)
            content = "\n".join(texts)
        message = {"role": m.role, "content": content if content is not None else ""}
        if m.name is not None:
            message["name"] = m.name
        if m.tool_calls is not None:
            message["tool_calls"] = m.tool_calls
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        out.append(message)
    return out


def render_chat(tokenizer, template: str | None, messages: Sequence[ChatMessage], *,
                add_generation_prompt: bool = True, continue_final_message: bool = False,
                add_special_tokens: bool = False, template_kwargs: dict[str, Any] | None = None,
                tools: list[dict[str, Any]] | None = None) -> list[int]:
    if template is None:
        raise bad_request("this model has no chat template; start the server with --chat-template FILE, send "
                          "'chat_template' in the request, or use /v1/completions", "messages")
    if add_generation_prompt and continue_final_message:
        raise bad_request("add_generation_prompt and continue_final_message cannot both be true; set "
                          "add_generation_prompt=false to continue the last message", "continue_final_message")
    if continue_final_message and messages[-1].role != "assistant":
        raise bad_request("continue_final_message needs the last message to be the assistant's",
                          "continue_final_message")
    conversation = message_dicts(messages)
    try:
        text = tokenizer.apply_chat_template(
            conversation, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, tools=tools, **(template_kwargs or {}))
    except jinja2.TemplateError as error:   # also the templates' own raise_exception("roles must alternate")
        raise bad_request(f"the chat template refused these messages: {error}", "messages") from None
    except (TypeError, ValueError) as error:
        raise bad_request(f"could not apply the chat template: {error}", "messages") from None
    # The template writes the special tokens itself (BOS, role markers): by default add none.
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)
