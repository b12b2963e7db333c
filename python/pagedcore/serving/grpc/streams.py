"""Driving the async engine's per-request streams: with a time limit, and several at once.

Both keep one promise: whatever way a call ends (finished, time limit, a sibling failed, the client
cancelled, the deadline passed), every engine stream it opened is closed, and closing a stream
that has not finished aborts its request and frees its KV blocks at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import aclosing
from typing import TypeVar

T = TypeVar("T")


class _TimeLimit:
    def __repr__(self) -> str:
        return "TIME_LIMIT"


TIME_LIMIT = _TimeLimit()   # yielded once, last, when the time limit ran out first


async def until_deadline(stream: AsyncIterator[T], deadline: float | None) -> AsyncIterator[T | _TimeLimit]:
    """Yields the stream's items until it ends, or yields TIME_LIMIT once `deadline` (a
    time.monotonic() value; None = none) passes first. Either way the stream is closed on exit."""
    async with aclosing(stream):
        while True:
            if deadline is None:
                try:
                    item = await anext(stream)
                except StopAsyncIteration:
                    return
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    yield TIME_LIMIT
                    return
                try:
                    # Cancelling the wait cancels the stream inside its await, which aborts the request.
                    item = await asyncio.wait_for(anext(stream), remaining)
                except StopAsyncIteration:
                    return
                except asyncio.TimeoutError:
                    yield TIME_LIMIT
                    return
            yield item


async def run_all(coroutines: Sequence[Awaitable[T]]) -> list[T]:
    """Runs the coroutines concurrently and returns their results in order. The first failure
    cancels the rest (so their requests are aborted) and is raised; so is a cancellation of the
    caller (client gone), which cancels them all."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    if not tasks:
        return []
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()
        return [task.result() for task in tasks]
    finally:
        pending = [task for task in tasks if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


__all__ = ["TIME_LIMIT", "until_deadline", "run_all"]
