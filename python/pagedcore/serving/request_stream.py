"""A request's outputs on the handler's side: the queue the engine thread fills (`OutputQueue`), and
the async iterator handlers read (`RequestStream`), which folds deltas for non-streaming callers and
aborts the request when closed early."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pagedcore.outputs import CompletionOutput, RequestOutput


class OutputQueue:
    """One request's outputs, handed from the engine thread to the handler's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()

    def put(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the handler's loop is closed: nobody is listening any more
            pass


class DeltaAccumulator:
    """Folds a request's delta outputs into one cumulative output (non-streaming callers)."""

    def __init__(self):
        self.completions: dict[int, CompletionOutput] = {}
        self.prompt_logprobs = None

    def add(self, delta: RequestOutput) -> RequestOutput:
        for c in delta.outputs:
            acc = self.completions.get(c.index)
            if acc is None:
                self.completions[c.index] = CompletionOutput(
                    c.index, c.text, list(c.token_ids), c.cumulative_logprob,
                    None if c.logprobs is None else list(c.logprobs), c.finish_reason, c.stop_reason)
                continue
            acc.text += c.text
            acc.token_ids.extend(c.token_ids)
            if c.logprobs is not None:
                acc.logprobs = (acc.logprobs or []) + list(c.logprobs)
            acc.cumulative_logprob = c.cumulative_logprob
            acc.finish_reason, acc.stop_reason = c.finish_reason, c.stop_reason
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        return RequestOutput(delta.request_id, delta.prompt, delta.prompt_token_ids, self.prompt_logprobs,
                             [self.completions[i] for i in sorted(self.completions)], delta.finished,
                             delta.metrics)


class RequestStream:
    """One request's outputs as an async iterator: deltas, or (stream=False) one final output.

    Use it as `async with engine.add_request(...) as outputs: async for out in outputs: ...`:
    leaving early (client gone, deadline passed, cancelled) aborts the request and frees its blocks.
    An error of this request alone (the engine refused it, or a step failed) is raised from the
    iteration.
    """

    def __init__(self, request_id: str, stream: OutputQueue, incremental: bool, abort: Callable[[], None],
                 release: Callable[[], None]):
        self.request_id = request_id
        self._stream = stream
        self._abort = abort           # tells the engine thread to abort the request
        self._release = release       # forgets the request's queue
        self._accumulator = None if incremental else DeltaAccumulator()
        self._done = False       # final output or error delivered: nothing left to abort

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        while not self._done:
            item = await self._stream.queue.get()
            if isinstance(item, BaseException):
                self._finish()
                raise item
            if item.finished:
                self._finish()
            if self._accumulator is None:
                return item
            merged = self._accumulator.add(item)
            if item.finished:
                return merged
        raise StopAsyncIteration

    def _finish(self) -> None:
        self._done = True
        self._release()

    async def aclose(self) -> None:
        if not self._done:
            self._done = True
            self._abort()              # the caller left: free the blocks at once
            self._release()

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
