"""Plumbing between engine streams and HTTP: SSE framing, merging a batch's streams, and aborting
work whose client has gone.

A streaming response is cancelled by Starlette when the client disconnects (it listens for
http.disconnect beside the body), which closes our generators and so aborts the engine requests. A
non-streaming handler has no such listener: `until_disconnected` watches the connection itself.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import TypeVar

from fastapi import Request

from pagedcore.outputs import RequestOutput
from pagedcore.serving.async_engine import RequestStream

T = TypeVar("T")

DONE = "data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy buffering of tokens


def sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


class ClientGone(Exception):
    """The client disconnected before its response was ready; its requests were aborted."""


async def merge_streams(streams: Sequence[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(stream index, output) in arrival order across the streams of one HTTP request (a batch of
    prompts). The caller closes the streams."""
    if len(streams) == 1:
        async for output in streams[0]:
            yield 0, output
        return
    pending = {asyncio.ensure_future(s.__anext__()): i for i, s in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=pending.get):
                i = pending.pop(task)
                try:
                    output = task.result()
                except StopAsyncIteration:
                    continue
                yield i, output
                pending[asyncio.ensure_future(streams[i].__anext__())] = i
    finally:
        for task in pending:
            task.cancel()


async def collect(streams: Sequence[RequestStream]) -> list[RequestOutput]:
    """The final output of each stream (opened with stream=False), in stream order."""
    finals: list[RequestOutput | None] = [None] * len(streams)
    async for i, output in merge_streams(streams):
        finals[i] = output
    return finals


async def close_all(streams: Sequence[RequestStream]) -> None:
    for s in streams:
        await s.aclose()


async def _disconnected(request: Request) -> None:
    # After the body is read, the next ASGI message is http.disconnect, sent the moment the peer goes.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _chain(first: T, rest: AsyncIterator[T]) -> AsyncIterator[T]:
    yield first
    async for item in rest:
        yield item


async def _nothing() -> AsyncIterator:
    return
    yield


async def after_first(request: Request, outputs: AsyncIterator[T]) -> AsyncIterator[T]:
    """Waits for the first output (the prefill has run) before a streaming response starts, and
    returns an iterator over all the outputs, that one first. So a request that fails before its
    first token gets a real HTTP error status instead of a 200 with an error inside the stream, and
    the chat `role` chunk goes out with the first token. Raises ClientGone or the request's error;
    the caller closes the engine streams either way."""
    try:
        first = await until_disconnected(request, outputs.__anext__())
    except StopAsyncIteration:
        return _nothing()
    return _chain(first, outputs)


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Runs `work`; if the client disconnects first, cancels it (its streams abort) and raises ClientGone."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ClientGone()
    return task.result()
