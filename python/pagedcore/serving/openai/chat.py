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
from pagedcore.serving.openai.logprobs import chat_logprobs, prompt_logprobs_json
from pagedcore.serving.openai.params import beam_search_params, requested_prompt_logprobs, sampling_params
from pagedcore.serving.openai.protocol import ChatCompletionRequest
from pagedcore.serving.openai.streaming import (DONE, SSE_HEADERS, ClientGone, after_first, collect, sse,
                                                until_disconnected)
from pagedcore.serving.openai.structured import Constraint, check_compiles, constraint_of
from pagedcore.serving.openai.tools import ToolPlan, ToolStream, finish_reason, plan_tools
from pagedcore.serving.openai.usage import Usage, usage_of
from pagedcore.serving.state import ServerState


async def create_chat_completion(request: Request, state: ServerState) -> Response:
    req = await parse_request(request, ChatCompletionRequest, state.max_request_body_bytes)
    lora_request = state.check_model(req.model)  # a LoRA adapter's name selects it
    engine = state.require_engine()
    tool_plan = plan_tools(req.tools, req.tool_choice, _auto_tool_parser(state), req.parallel_tool_calls)
    constraint = constraint_of(req)
    if tool_plan.constraint is not None:
        if constraint is not None:
            raise bad_request(f"tool_choice {req.tool_choice!r} constrains the reply to tool calls; it cannot be "
                              f"combined with {constraint.field.split('.')[0]}", "tool_choice")
        constraint = Constraint(tool_plan.constraint, "tools")
    prompt_ids = render_chat(state.tokenizer, req.chat_template or state.chat_template, req.messages,
                             add_generation_prompt=req.add_generation_prompt,
                             continue_final_message=req.continue_final_message,
                             add_special_tokens=req.add_special_tokens, template_kwargs=req.chat_template_kwargs,
                             tools=tool_plan.tools)
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")
    names = {"logprobs": "top_logprobs"}
    max_tokens = req.max_tokens
    if req.max_completion_tokens is not None:   # the newer name wins, as on api.openai.com
        max_tokens = req.max_completion_tokens
        names["max_tokens"] = "max_completion_tokens"
    if req.use_beam_search:   # n beams, the n best come back as choices (engine/beam_search.py)
        params = beam_search_params(req, state, prompt_len=len(prompt_ids), max_tokens=max_tokens,
                                    default_max_tokens=None, logprobs=req.logprobs, prompt_field="messages",
                                    names={k: v for k, v in names.items() if k == "max_tokens"},
                                    constrained_by=None if constraint is None else constraint.field.split(".")[0])
    else:
        params = sampling_params(req, state, prompt_len=len(prompt_ids), max_tokens=max_tokens,
                                 default_max_tokens=None, logprobs=(req.top_logprobs or 0) if req.logprobs else None,
                                 prompt_logprobs=requested_prompt_logprobs(req, state),
                                 names=names, prompt_field="messages",
                                 structured_outputs=None if constraint is None else constraint.params)
    await check_compiles(engine, constraint)
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    try:
        stream = engine.add_request(None, params, request_id, prompt_token_ids=prompt_ids, priority=req.priority,
                                    stream=req.stream, lora_request=lora_request)
    except Exception as error:
        raise engine_error(error) from None
    meta = _Meta(request_id, state, req, tool_plan)
    if req.stream:
        try:   # the response (status 200) starts with the first token: a failed prefill is a clean error
            outputs = await after_first(request, stream)
        except ClientGone:
            await stream.aclose()
            return Response(status_code=499)
        except Exception as error:
            await stream.aclose()
            raise engine_error(error) from None
        return StreamingResponse(_stream(stream, outputs, meta), media_type="text/event-stream",
                                 headers=SSE_HEADERS)
    try:
        (output,) = await until_disconnected(request, collect([stream]))
    except ClientGone:
        return Response(status_code=499)   # nobody reads it; the request is already aborted
    except Exception as error:
        raise engine_error(error) from None
    finally:
        await stream.aclose()
    return JSONResponse(_response(output, meta))


def _auto_tool_parser(state: ServerState) -> str | None:
    """vLLM's --enable-auto-tool-choice --tool-call-parser: the parser when "auto" is allowed, else None."""
    return state.tool_call_parser if state.enable_auto_tool_choice else None


class _Meta:
    def __init__(self, request_id: str, state: ServerState, req: ChatCompletionRequest, tool_plan: ToolPlan):
        self.request_id, self.state, self.req, self.tool_plan = request_id, state, req, tool_plan
        self.created = int(time.time())
        last = req.messages[-1]
        # vLLM's echo: the reply starts with the last message when that is the assistant's own.
        self.echo_text = ""
        if req.echo and last.role == "assistant":
            content = last.content
            self.echo_text = content if isinstance(content, str) else "\n".join(
                p.text or "" for p in content or [])

    def envelope(self, obj: str, choices: list, usage: dict | None = None,
                 prompt_logprobs_of: RequestOutput | None = None) -> dict:
        """prompt_logprobs_of: the output whose prompt logprobs go in this body (vLLM puts them at the
        top level of a chat response: one prompt for every choice)."""
        body = {"id": self.request_id, "object": obj, "created": self.created, "model": self.state.response_model_name(self.req.model),
                "choices": choices}
        if usage is not None:
            body["usage"] = usage
        n = self.req.prompt_logprobs
        if prompt_logprobs_of is not None and n is not None:
            body["prompt_logprobs"] = prompt_logprobs_json(prompt_logprobs_of.prompt_token_ids,
                                                           prompt_logprobs_of.prompt_logprobs,
                                                           self.state.vocab_size if n == -1 else n)
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
        content, calls = meta.tool_plan.calls_of(c.text)
        message = {"role": "assistant", "content": meta.echo_text + content if content is not None else None}
        if calls:
            message["tool_calls"] = calls
        choices.append({"index": c.index, "message": message, "logprobs": meta.logprobs(c),
                        "finish_reason": finish_reason(meta.tool_plan, calls, c.finish_reason),
                        "stop_reason": c.stop_reason})
    return meta.envelope("chat.completion", choices, usage_of([output]), prompt_logprobs_of=output)


async def _stream(stream, outputs, meta: _Meta):
    """stream: the engine request (closed at the end); outputs: its outputs, the first already in."""
    req = meta.req
    options = req.stream_options
    continuous = options is not None and options.continuous_usage_stats
    usage = Usage(1)
    tool_streams = [ToolStream(meta.tool_plan) for _ in range(req.n)]
    try:
        role_sent = False
        async for out in outputs:
            usage.add(0, out)
            if not role_sent:
                # The role comes first, in a chunk of its own per choice, as OpenAI sends it: after the
                # prefill, with the first token. With continuous usage stats every chunk carries usage.
                role_sent = True
                for index in range(req.n):
                    delta = {"role": "assistant", "content": meta.echo_text}
                    yield sse(meta.envelope("chat.completion.chunk", [
                        {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}],
                        usage.as_dict() if continuous else None, prompt_logprobs_of=out if index == 0 else None))
            for c in out.outputs:
                text, calls = tool_streams[c.index].feed(c.text), []
                if c.finish_reason is not None:
                    rest, calls = tool_streams[c.index].finish()
                    text += rest
                if not text and c.finish_reason is None and not (req.logprobs and c.token_ids):
                    continue
                delta = {"content": text} if text or (c.finish_reason is None and not calls) else {}
                if calls:
                    delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(calls)]
                # A stream cut by a server shutdown ends with vLLM's "abort"; clients treat it as truncated.
                choice = {"index": c.index, "delta": delta, "logprobs": meta.logprobs(c),
                          "finish_reason": finish_reason(meta.tool_plan, calls, c.finish_reason),
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
