"""The page's workload button: N requests sharing a system prompt, sent through the real engine so that
prefix-cache hits (the shared blocks) and, with a small cache, preemptions can be watched."""

from __future__ import annotations

import asyncio
import itertools
import logging

from fastapi import HTTPException

logger = logging.getLogger(__name__)

MAX_REQUESTS = 512
FIRST_TOKEN_TIMEOUT_S = 120.0
_SYSTEM_SENTENCE = ("You are a helpful assistant of the pagedcore inference engine. Answer briefly and "
                    "precisely, and say which scheduler step you would be in. ")
_QUESTIONS = ("What is a KV block?", "Why share a prefix?", "What is continuous batching?",
              "When does preemption happen?", "What does the block table map?", "What is chunked prefill?",
              "Why is decode memory-bound?", "What is copy-on-write?")
_batches = itertools.count(1)
_in_flight: set[asyncio.Task] = set()   # kept referenced until each request's stream ends


def _int(body: dict, name: str, default: int, lo: int, hi: int) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise HTTPException(400, f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


async def launch_workload(state, body: dict) -> dict:
    """Queues the requests now and returns their ids; their outputs are read and dropped."""
    from pagedcore.sampling_params import SamplingParams

    if state is None:
        raise HTTPException(404, "no engine behind this page: the workload button needs `pagedcore serve`")
    engine = state.require_engine()
    num_requests = _int(body, "num_requests", 16, 1, MAX_REQUESTS)
    system_sentences = _int(body, "system_prompt_sentences", 4, 0, 200)
    max_tokens = _int(body, "max_tokens", 24, 1, 4096)
    system = _SYSTEM_SENTENCE * system_sentences
    batch = next(_batches)
    prompts = [f"{system}Question {i}: {_QUESTIONS[i % len(_QUESTIONS)]}\nAnswer:" for i in range(num_requests)]
    longest = max(len(state.tokenizer.encode(p)) for p in prompts[:8])
    if longest + max_tokens > state.max_model_len:
        raise HTTPException(400, f"a prompt has {longest} tokens and max_tokens is {max_tokens}, more than "
                                 f"max_model_len ({state.max_model_len}); lower system_prompt_sentences or max_tokens")
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    request_ids = []
    for i, prompt in enumerate(prompts):
        request_id = f"workload-{batch}-{i}"
        try:
            stream = engine.add_request(prompt, params, request_id, stream=True)
        except Exception as error:   # queue full or draining: stop adding, report what was queued
            logger.warning("workload %d stopped after %d requests: %s", batch, i, error)
            break
        request_ids.append(request_id)
        first = None
        if i == 0 and num_requests > 1:
            # The first request's prompt blocks enter the prefix cache when its prefill ends: the rest,
            # sent after its first token, find the shared system prompt there (admitted in the same
            # step, they would all compute it).
            try:
                first = await asyncio.wait_for(stream.__anext__(), FIRST_TOKEN_TIMEOUT_S)
            except (asyncio.TimeoutError, StopAsyncIteration, Exception) as error:
                logger.info("workload %d: no first token from its first request (%s)", batch, error)
        task = asyncio.create_task(_consume(stream, done=first is not None and first.finished))
        _in_flight.add(task)
        task.add_done_callback(_in_flight.discard)
    return {"request_ids": request_ids, "num_prompt_tokens_max": longest, "max_tokens": max_tokens}


async def _consume(stream, done: bool = False) -> None:
    try:
        async with stream:
            if not done:
                async for _ in stream:
                    pass
    except Exception as error:   # this request failed; the page shows it from the trace
        logger.info("workload request %s failed: %s", stream.request_id, error)
