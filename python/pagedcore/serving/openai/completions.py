"""POST /v1/completions: prompts (text or token ids, one or a batch) -> completions, whole or as SSE."""

from __future__ import annotations

import time
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from pagedcore.outputs import RequestOutput
from pagedcore.serving.openai.body import parse_request
from pagedcore.serving.openai.errors import APIError, bad_request, engine_error, error_body
from pagedcore.serving.openai.logprobs import CompletionLogprobs, prompt_logprobs_json
from pagedcore.serving.openai.params import beam_search_params, requested_prompt_logprobs, sampling_params
from pagedcore.serving.openai.protocol import CompletionRequest
from pagedcore.serving.openai.streaming import (DONE, SSE_HEADERS, ClientGone, after_first, close_all, collect,
                                                merge_streams, sse, until_disconnected)
from pagedcore.serving.openai.structured import check_compiles, constraint_of
from pagedcore.serving.openai.usage import Usage, usage_of
from pagedcore.serving.state import ServerState

DEFAULT_MAX_TOKENS = 16


async def create_completion(request: Request, state: ServerState) -> Response:
    req = await parse_request(request, CompletionRequest, state.max_request_body_bytes)
    lora_request = state.check_model(req.model)  # a LoRA adapter's name selects it
    engine = state.require_engine()
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request("best_of is not supported (vLLM's V1 engine dropped it too); use n", "best_of")
    if req.suffix is not None:
        raise bad_request("suffix (insertion) is not supported by this model", "suffix")
    prompts = _prompts(req, state)
    constraint = constraint_of(req)
    await check_compiles(engine, constraint)
    # vLLM's prompt_logprobs field, and echo with logprobs (which reports the prompt's tokens too):
    # both read the same prompt rows, computed once with the larger number of alternatives.
    asked = [n for n in (requested_prompt_logprobs(req, state), req.logprobs if req.echo else None) if n is not None]
    prompt_logprobs = max(asked) if asked else None
    if req.use_beam_search:   # n beams per prompt, the n best come back (engine/beam_search.py)
        params = [beam_search_params(req, state, prompt_len=len(ids), max_tokens=req.max_tokens,
                                     default_max_tokens=DEFAULT_MAX_TOKENS, logprobs=req.logprobs is not None,
                                     constrained_by=None if constraint is None else constraint.field.split(".")[0])
                  for _, ids in prompts]
    else:
        params = [sampling_params(req, state, prompt_len=len(ids), max_tokens=req.max_tokens,
                                  default_max_tokens=DEFAULT_MAX_TOKENS, logprobs=req.logprobs,
                                  prompt_logprobs=prompt_logprobs,
                                  structured_outputs=None if constraint is None else constraint.params)
                  for _, ids in prompts]
    request_id = f"cmpl-{uuid.uuid4().hex}"
    streams = []
    try:
        for i, ((text, ids), p) in enumerate(zip(prompts, params)):
            streams.append(engine.add_request(text, p, f"{request_id}-{i}" if len(prompts) > 1 else request_id,
                                              prompt_token_ids=ids, priority=req.priority, stream=req.stream,
                                              lora_request=lora_request))
    except Exception as error:
        await close_all(streams)
        raise engine_error(error) from None
    meta = _Meta(request_id, state, req, prompts)
    if req.stream:
        try:   # the response (status 200) starts with the first token: a failed prefill is a clean error
            outputs = await after_first(request, merge_streams(streams))
        except ClientGone:
            await close_all(streams)
            return Response(status_code=499)
        except Exception as error:
            await close_all(streams)
            raise engine_error(error) from None
        return StreamingResponse(_stream(streams, outputs, meta), media_type="text/event-stream",
                                 headers=SSE_HEADERS)
    try:
        outputs = await until_disconnected(request, collect(streams))
    except ClientGone:
        return Response(status_code=499)   # nobody reads it; the requests are already aborted
    except Exception as error:
        raise engine_error(error) from None
    finally:
        await close_all(streams)
    return JSONResponse(_response(outputs, meta))


class _Meta:
    """What every chunk and the final body repeat."""

    def __init__(self, request_id: str, state: ServerState, req: CompletionRequest, prompts):
        self.request_id, self.state, self.req = request_id, state, req
        self.created = int(time.time())
        self.prompt_texts = [text if text is not None else state.tokenizer.decode(ids) for text, ids in prompts]

    def prompt_logprobs(self, out: RequestOutput) -> list | None:
        """vLLM's per-choice prompt_logprobs; -1 (the whole vocabulary) keeps every alternative."""
        n = self.req.prompt_logprobs
        return prompt_logprobs_json(out.prompt_token_ids, out.prompt_logprobs,
                                    self.state.vocab_size if n == -1 else n)

    def envelope(self, choices: list, usage: dict | None = None) -> dict:
        body = {"id": self.request_id, "object": "text_completion", "created": self.created,
                "model": self.state.response_model_name(self.req.model), "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return body


def _prompts(req: CompletionRequest, state: ServerState) -> list[tuple[str | None, list[int]]]:
    """(text or None, token ids) per prompt of the batch."""
    p = req.prompt
    if isinstance(p, str):
        batch = [p]
    elif not p:
        raise bad_request("prompt is an empty list; send a string, token ids, or a batch of them", "prompt")
    elif isinstance(p[0], int):
        batch = [p]
    else:
        batch = p
    prompts = []
    for i, item in enumerate(batch):
        where = "prompt" if len(batch) == 1 else f"prompt.{i}"
        if isinstance(item, str):
            ids = state.tokenizer.encode(item, add_special_tokens=req.add_special_tokens)
            prompts.append((item, ids))
        else:
            bad = [t for t in item if not 0 <= t < state.vocab_size]
            if bad:
                raise bad_request(f"{where} has token id {bad[0]}, outside this model's vocabulary "
                                  f"[0, {state.vocab_size})", where)
            prompts.append((None, list(item)))
        if not prompts[-1][1]:
            raise bad_request(f"{where} is empty; send at least one token", where)
    return prompts


def _response(outputs: list[RequestOutput], meta: _Meta) -> dict:
    req, tokenizer = meta.req, meta.state.tokenizer
    choices = []
    for i, out in enumerate(outputs):
        for c in out.outputs:
            if c.finish_reason == "abort":
                raise APIError(503, "the server shut down before this request finished; retry it")
            text = c.text
            logprobs = None
            if req.logprobs is not None:
                builder = CompletionLogprobs(req.logprobs, tokenizer)
                token_ids, positions = list(c.token_ids), list(c.logprobs or [])
                if req.echo:
                    token_ids = out.prompt_token_ids + token_ids
                    positions = list(out.prompt_logprobs or [None] * len(out.prompt_token_ids)) + positions
                logprobs = builder.build(token_ids, positions)
            if req.echo:
                text = meta.prompt_texts[i] + text
            choices.append({"index": i * req.n + c.index, "text": text, "logprobs": logprobs,
                            "finish_reason": c.finish_reason, "stop_reason": c.stop_reason})
            if req.prompt_logprobs is not None:
                choices[-1]["prompt_logprobs"] = meta.prompt_logprobs(out)
    return meta.envelope(choices, usage_of(outputs))


async def _stream(streams, outputs, meta: _Meta):
    """streams: the engine requests (closed at the end); outputs: merge_streams over them, the first in."""
    req, tokenizer = meta.req, meta.state.tokenizer
    options = req.stream_options
    usage = Usage(len(streams))
    builders: dict[int, CompletionLogprobs] = {}     # choice index -> its running text offset
    started: set[int] = set()
    try:
        async for i, out in outputs:
            usage.add(i, out)
            for c in out.outputs:
                index = i * req.n + c.index
                text, token_ids, positions = c.text, list(c.token_ids), list(c.logprobs or [])
                prompt_logprobs = None
                if index not in started:
                    started.add(index)
                    if req.prompt_logprobs is not None:   # 0 only: larger counts do not stream (protocol.py)
                        prompt_logprobs = meta.prompt_logprobs(out)
                    if req.echo:
                        text = meta.prompt_texts[i] + text
                        token_ids = out.prompt_token_ids + token_ids
                        positions = list(out.prompt_logprobs or [None] * len(out.prompt_token_ids)) + positions
                logprobs = None
                if req.logprobs is not None:
                    builder = builders.setdefault(index, CompletionLogprobs(req.logprobs, tokenizer))
                    logprobs = builder.build(token_ids, positions)
                if not text and c.finish_reason is None and not (logprobs and logprobs["tokens"]) \
                        and prompt_logprobs is None:
                    continue
                choice = {"index": index, "text": text, "logprobs": logprobs,
                          "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
                if prompt_logprobs is not None:    # in the choice's first chunk
                    choice["prompt_logprobs"] = prompt_logprobs
                continuous = options is not None and options.continuous_usage_stats
                yield sse(meta.envelope([choice], usage.as_dict() if continuous else None))
        if options is not None and options.include_usage:
            yield sse(meta.envelope([], usage.as_dict()))
    except Exception as error:   # the response has started: report in-band, as OpenAI does
        e = engine_error(error)
        yield sse(error_body(e.status, e.message, e.param, e.code))
    finally:
        await close_all(streams)
    yield DONE
