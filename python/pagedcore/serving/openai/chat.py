"""POST /v1/chat/completions: messages -> the model's chat template -> assistant replies, whole or as SSE."""

from __future__ import annotations

import time
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from pagedcore.outputs import RequestOutput
from pagedcore.serving.openai.body import parse_request
from pagedcore.serving.openai.chat_template import render_chat
from pagedcore.serving.openai.errors import APIError, bad_request, engine_error, error_body
from pagedcore.serving.openai.logprobs import chat_logprobs
from pagedcore.serving.openai.params import sampling_params
from pagedcore.serving.openai.protocol import ChatCompletionRequest
from pagedcore.serving.openai.streaming import (DONE, SSE_HEADERS, ClientGone, collect, sse,
                                                until_disconnected)
from pagedcore.serving.openai.usage import Usage, usage_of
from pagedcore.serving.state import ServerState


async def create_chat_completion(request: Request, state: ServerState) -> Response:
    req = await parse_request(request, ChatCompletionRequest, state.max_request_body_bytes)
    state.check_model(req.model)
    engine = state.require_engine()
    _reject_unsupported(req)
    prompt_ids = render_chat(state.tokenizer, req.chat_template or state.chat_template, req.messages,
                             add_generation_prompt=req.add_generation_prompt,
                             continue_final_message=req.continue_final_message,
                             add_special_tokens=req.add_special_tokens, template_kwargs=req.chat_template_kwargs)
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")
    names = {"logprobs": "top_logprobs"}
    max_tokens = req.max_tokens
    if req.max_completion_tokens is not None:   # the newer name wins, as on api.openai.com
        max_tokens = req.max_completion_tokens
        names["max_tokens"] = "max_completion_tokens"
    params = sampling_params(req, state, prompt_len=len(prompt_ids), max_tokens=max_tokens, default_max_tokens=None,
                             logprobs=(req.top_logprobs or 0) if req.logprobs else None, names=names,
                             prompt_field="messages")
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    try:
        stream = engine.add_request(None, params, request_id, prompt_token_ids=prompt_ids, priority=req.priority,
                                    stream=req.stream)
    except Exception as error:
        raise engine_error(error) from None
    meta = _Meta(request_id, state, req)
    if req.stream:
        return StreamingResponse(_stream(stream, meta), media_type="text/event-stream", headers=SSE_HEADERS)
    try:
        (output,) = await until_disconnected(request, collect([stream]))
    except ClientGone:
        return Response(status_code=499)   # nobody reads it; the request is already aborted
    except Exception as error:
        raise engine_error(error) from None
    finally:
        await stream.aclose()
    return JSONResponse(_response(output, meta))


def _reject_unsupported(req: ChatCompletionRequest) -> None:
    """Fields we could silently ignore, but a client relying on them would get wrong answers."""
    if req.tools:
        raise bad_request("tool calling is not supported by this server; send the request without tools", "tools")
    if req.tool_choice not in (None, "none", "auto"):
        raise bad_request("tool_choice is not supported by this server (no tools)", "tool_choice")
    if req.response_format is not None and req.response_format.get("type", "text") != "text":
        raise bad_request(f"response_format {req.response_format.get('type')!r} (structured output) is not "
                          "supported; use {\"type\": \"text\"} or leave it out", "response_format")


class _Meta:
    def __init__(self, request_id: str, state: ServerState, req: ChatCompletionRequest):
        self.request_id, self.state, self.req = request_id, state, req
        self.created = int(time.time())
        last = req.messages[-1]
        # vLLM's echo: the reply starts with the last message when that is the assistant's own.
        self.echo_text = ""
        if req.echo and last.role == "assistant":
            content = last.content
            self.echo_text = content if isinstance(content, str) else "\n".join(
                p.text or "" for p in content or [])

    def envelope(self, obj: str, choices: list, usage: dict | None = None) -> dict:
        body = {"id": self.request_id, "object": obj, "created": self.created, "model": self.state.model_name,
                "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return body

    def logprobs(self, c) -> dict | None:
        if not self.req.logprobs:
            return None
        return chat_logprobs(c.token_ids, c.logprobs or [], self.req.top_logprobs or 0, self.state.tokenizer)


def _response(output: RequestOutput, meta: _Meta) -> dict:
    choices = []
    for c in output.outputs:
        if c.finish_reason == "abort":
            raise APIError(503, "the server shut down before this request finished; retry it")
        choices.append({"index": c.index, "message": {"role": "assistant", "content": meta.echo_text + c.text},
                        "logprobs": meta.logprobs(c), "finish_reason": c.finish_reason, "stop_reason": c.stop_reason})
    return meta.envelope("chat.completion", choices, usage_of([output]))


async def _stream(stream, meta: _Meta):
    req = meta.req
    options = req.stream_options
    continuous = options is not None and options.continuous_usage_stats
    usage = Usage(1)
    try:
        # The role comes first, in a chunk of its own per choice, as OpenAI sends it.
        for index in range(req.n):
            delta = {"role": "assistant", "content": meta.echo_text}
            yield sse(meta.envelope("chat.completion.chunk", [
                {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}]))
        async for out in stream:
            usage.add(0, out)
            for c in out.outputs:
                if not c.text and c.finish_reason is None and not (req.logprobs and c.token_ids):
                    continue
                # A stream cut by a server shutdown ends with vLLM's "abort"; clients treat it as truncated.
                choice = {"index": c.index, "delta": {"content": c.text} if c.text or c.finish_reason is None else {},
                          "logprobs": meta.logprobs(c), "finish_reason": c.finish_reason,
                          "stop_reason": c.stop_reason}
                yield sse(meta.envelope("chat.completion.chunk", [choice], usage.as_dict() if continuous else None))
        if options is not None and options.include_usage:
            yield sse(meta.envelope("chat.completion.chunk", [], usage.as_dict()))
    except Exception as error:   # the response has started: report in-band, as OpenAI does
        e = engine_error(error)
        yield sse(error_body(e.status, e.message, e.param, e.code))
    finally:
        await stream.aclose()
    yield DONE
