"""AsyncLLMEngine: the engine's step loop on one background thread, feeding asyncio streams.

    HTTP / gRPC handlers ──generate()──▶ inbox ──▶ [engine thread: add, abort, step] ──▶ per-request
                                                                                          asyncio.Queue
Every request from every front end shares every step (continuous batching across both). The
engine is touched only by its thread: handlers send commands through the inbox, and read engine
statistics from a snapshot the thread publishes after each step.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from pagedcore.engine.llm_engine import LLMEngine
from pagedcore.outputs import RequestOutput
from pagedcore.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """The waiting queue is at --max-queued-requests: answer 429 / RESOURCE_EXHAUSTED."""


class EngineDrainingError(RuntimeError):
    """The server is shutting down and accepts no new requests: answer 503 / UNAVAILABLE."""


class EngineDeadError(RuntimeError):
    """The engine thread stopped after an unrecoverable error."""


@dataclass
class _Add:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    params: SamplingParams
    priority: int
    output_kind: str
    stream: _Stream


@dataclass
class _Abort:
    request_id: str


class _Stream:
    """One request's outputs, handed from the engine thread to the handler's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()

    def put(self, item) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


@dataclass
class EngineSnapshot:
    """Engine state published by the engine thread after every step (read by /metrics, /health)."""

    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    kv_cache_usage: float = 0.0
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    num_preemptions: int = 0
    num_steps: int = 0


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine, max_queued_requests: int | None = None):
        self.engine = engine
        self.max_queued_requests = max_queued_requests
        self.snapshot = EngineSnapshot()
        self.step_hooks = []            # called on the engine thread after each step: hook(outputs, timing)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._num_pending_adds = 0
        self._lock = threading.Lock()   # guards _streams and _num_pending_adds across threads
        self._accepting = True
        self._stop = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="pagedcore-engine", daemon=True)
        self._thread.start()

    # -- handler side (any event loop) --------------------------------------------------------------
    @property
    def accepting(self) -> bool:
        return self._accepting and self.error is None

    def num_in_flight(self) -> int:
        with self._lock:
            return len(self._streams)

    async def generate(self, prompt: str | None = None, params: SamplingParams | None = None,
                       request_id: str | None = None, *, prompt_token_ids: Sequence[int] | None = None,
                       priority: int = 0, stream: bool = True) -> AsyncIterator[RequestOutput]:
        """Yields RequestOutputs: deltas when stream=True, else one final output. Closing the
        iterator early (client gone, deadline passed) aborts the request and frees its blocks."""
        if self.error is not None:
            raise EngineDeadError(f"the engine stopped after an error: {self.error}")
        if not self._accepting:
            raise EngineDrainingError("the server is shutting down and accepts no new requests")
        request_id = request_id or uuid.uuid4().hex
        s = _Stream(asyncio.get_running_loop())
        with self._lock:
            if request_id in self._streams:
                raise ValueError(f"request id {request_id!r} is already in flight")
            if self.max_queued_requests is not None and \
                    self.snapshot.num_waiting + self._num_pending_adds >= self.max_queued_requests:
                raise QueueFullError(f"the waiting queue is full ({self.max_queued_requests} requests); "
                                     "retry later or start the server with a larger --max-queued-requests")
            self._streams[request_id] = s
            self._num_pending_adds += 1
        self._send(_Add(request_id, prompt, None if prompt_token_ids is None else list(prompt_token_ids),
                        params or SamplingParams(), priority, "delta" if stream else "final", s))
        finished = False
        try:
            while True:
                item = await s.queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            if not finished:
                self._send(_Abort(request_id))   # client gone: free the blocks at once
            with self._lock:
                self._streams.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        self._send(_Abort(request_id))

    def _send(self, command) -> None:
        self._inbox.put(command)
        self._wakeup.set()

    async def shutdown(self, timeout: float = 30.0) -> None:
        """Stops accepting, lets in-flight requests finish for up to `timeout` seconds, aborts the
        rest, then stops the engine thread."""
        self._accepting = False
        deadline = time.monotonic() + timeout
        while self.num_in_flight() and time.monotonic() < deadline and self._thread.is_alive():
            await asyncio.sleep(0.05)
        with self._lock:
            left = list(self._streams)
        for request_id in left:
            self._send(_Abort(request_id))
        self._stop = True
        self._wakeup.set()
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 10.0)

    # -- engine thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        while not self._stop:
            self._drain_inbox()
            if not engine.has_unfinished_requests():
                self._publish()
                self._wakeup.wait(0.5)
                self._wakeup.clear()
                continue
            try:
                outputs = engine.step()
            except Exception as e:  # a failed step fails the requests in flight, not the server
                logger.exception("engine step failed; failing the requests in flight")
                self._fail_all(e)
                continue
            for output in outputs:
                with self._lock:
                    s = self._streams.get(output.request_id)
                if s is not None:
                    s.put(output)
            self._publish()
            for hook in self.step_hooks:
                try:
                    hook(outputs, engine.last_step_timing)
                except Exception:
                    logger.exception("step hook failed")
        self._drain_inbox()
        for request_id in list(engine.requests):
            engine.abort_request(request_id)

    def _drain_inbox(self) -> None:
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, _Add):
                with self._lock:
                    self._num_pending_adds -= 1
                    alive = command.request_id in self._streams
                if not alive:
                    continue    # the client left before the engine saw the request
                try:
                    self.engine.add_request(command.request_id, prompt=command.prompt, params=command.params,
                                            prompt_token_ids=command.prompt_token_ids,
                                            priority=command.priority, output_kind=command.output_kind)
                except Exception as e:  # this request alone fails
                    command.stream.put(e)
            else:
                self.engine.abort_request(command.request_id)

    def _fail_all(self, error: Exception) -> None:
        for request_id in list(self.engine.requests):
            self.engine.abort_request(request_id)
            with self._lock:
                s = self._streams.get(request_id)
            if s is not None:
                s.put(RuntimeError(f"the engine failed while running this request: {error}"))

    def _publish(self) -> None:
        st = self.engine.scheduler.stats()
        self.snapshot = EngineSnapshot(
            num_running=st.num_running, num_waiting=st.num_waiting, num_swapped=st.num_swapped,
            kv_cache_usage=st.kv_cache_usage, prefix_query_tokens=st.prefix_query_tokens,
            prefix_hit_tokens=st.prefix_hit_tokens, num_preemptions=st.num_preemptions, num_steps=st.num_steps)
