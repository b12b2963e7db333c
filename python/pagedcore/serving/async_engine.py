"""AsyncLLMEngine: the engine's step loop on one background thread, feeding asyncio streams.

    HTTP / gRPC handlers ──add_request()──▶ inbox ──▶ [engine thread: add, abort, step] ──▶ per-request
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
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import torch

from pagedcore.distributed.errors import WorkerDiedError
from pagedcore.engine.llm_engine import LLMEngine
from pagedcore.outputs import RequestOutput
from pagedcore.sampling_params import SamplingParams
from pagedcore.serving.request_stream import OutputQueue, RequestStream

logger = logging.getLogger(__name__)

# hook(outputs, timing) on the engine thread: after each step with that step's outputs and
# `engine.last_step_timing`, and with ([final output], None) when a request is aborted.
StepHook = Callable[[list[RequestOutput], dict | None], None]


# Seconds a client refused for a full queue should wait before retrying (HTTP Retry-After, and the
# gRPC status message): about the time a small batch takes to move on a CPU.
RETRY_AFTER_S = 1


class QueueFullError(RuntimeError):
    """The waiting queue is at --max-queued-requests: answer 429 + Retry-After / RESOURCE_EXHAUSTED."""

    retry_after_s = RETRY_AFTER_S


class EngineDrainingError(RuntimeError):
    """The server is shutting down and accepts no new requests: answer 503 / UNAVAILABLE."""


class EngineDeadError(RuntimeError):
    """The engine thread stopped after an unrecoverable error."""


class StepFailedError(RuntimeError):
    """The step running this request raised; the request failed, the engine goes on (HTTP 500 / INTERNAL)."""


# A step that fails fails the requests it was running and the engine goes on; this many failures in
# a row (every step failing, whatever it runs) means the engine itself is broken.
MAX_CONSECUTIVE_STEP_FAILURES = 3


def leaves_engine_unusable(error: BaseException) -> bool:
    """Errors after which no later step can be trusted: memory exhausted, a device fault (a CUDA
    error poisons its context), a model rank that died (the model is missing a shard), or any
    exception marked `engine_unusable = True`."""
    if getattr(error, "engine_unusable", False) or isinstance(error, (MemoryError, SystemError, WorkerDiedError)):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("CUDA error" in text or "device-side assert" in text)


@dataclass
class _Add:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    params: SamplingParams
    priority: int
    stream: OutputQueue
    arrival_time: float     # when the handler asked: TTFT and queue time count the wait for the engine thread
    lora_request: object = None  # a pagedcore.lora.LoRARequest, or None for the base model


@dataclass
class _Abort:
    request_id: str


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
        self.step_hooks: list[StepHook] = []
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._streams: dict[str, OutputQueue] = {}
        self._num_pending_adds = 0      # sent but not yet in a published snapshot's num_waiting
        self._lock = threading.Lock()   # guards _streams and _num_pending_adds across threads
        self._accepting = True
        self._stop = False
        self.error: BaseException | None = None
        self.on_dead: Callable[[BaseException], None] | None = None   # called on the engine thread when it dies
        self._num_failed_steps_in_a_row = 0
        self._thread = threading.Thread(target=self._run, name="pagedcore-engine", daemon=True)
        self._thread.start()

    # -- handler side (any event loop) --------------------------------------------------------------
    @property
    def accepting(self) -> bool:
        return self._accepting and self.error is None and self._thread.is_alive()

    def num_in_flight(self) -> int:
        with self._lock:
            return len(self._streams)

    def add_request(self, prompt: str | None = None, params: SamplingParams | None = None,
                    request_id: str | None = None, *, prompt_token_ids: Sequence[int] | None = None,
                    priority: int = 0, stream: bool = True, lora_request=None) -> RequestStream:
        """Queues a request now and returns its RequestStream. Raises at once, before anything is
        queued: EngineDrainingError (shutting down), QueueFullError (past --max-queued-requests),
        EngineDeadError, ValueError (request id in use). Call from an event loop."""
        if not self._accepting and self.error is None:
            raise EngineDrainingError("the server is shutting down and accepts no new requests; "
                                      "retry against another replica")
        request_id = request_id or uuid.uuid4().hex
        s = OutputQueue(asyncio.get_running_loop())
        with self._lock:
            # Under the lock: the engine thread sets `error` before it fails the streams it holds, so a
            # request either sees the error here or is among those failed.
            if self.error is not None or not self._thread.is_alive():
                raise EngineDeadError(f"the engine stopped after an error: {self.error}; the server is restarting, "
                                      "retry against another replica")
            if request_id in self._streams:
                raise ValueError(f"request id {request_id!r} is already in flight")
            if self.max_queued_requests is not None and \
                    self.snapshot.num_waiting + self._num_pending_adds >= self.max_queued_requests:
                raise QueueFullError(f"the waiting queue is full ({self.max_queued_requests} requests); retry "
                                     f"after {RETRY_AFTER_S} s, or start the server with a larger "
                                     "--max-queued-requests")
            self._streams[request_id] = s
            self._num_pending_adds += 1
        # Always "delta" inside the engine: every step then reports every request (exact metrics),
        # and a non-streaming caller's RequestStream folds the deltas into one output.
        self._send(_Add(request_id, prompt, None if prompt_token_ids is None else list(prompt_token_ids),
                        params or SamplingParams(), priority, s, time.time(), lora_request))
        return RequestStream(request_id, s, incremental=stream, abort=lambda: self._send(_Abort(request_id)),
                             release=lambda: self._release(request_id))

    async def generate(self, prompt: str | None = None, params: SamplingParams | None = None,
                       request_id: str | None = None, *, prompt_token_ids: Sequence[int] | None = None,
                       priority: int = 0, stream: bool = True, lora_request=None) -> AsyncIterator[RequestOutput]:
        """Yields RequestOutputs: deltas when stream=True, else one final output. Closing the
        iterator early (client gone, deadline passed) aborts the request and frees its blocks.
        The errors of add_request are raised on the first iteration."""
        outputs = self.add_request(prompt, params, request_id, prompt_token_ids=prompt_token_ids,
                                   priority=priority, stream=stream, lora_request=lora_request)
        async with outputs:
            async for output in outputs:
                yield output

    async def abort(self, request_id: str) -> None:
        self._send(_Abort(request_id))

    def _send(self, command) -> None:
        self._inbox.put(command)
        self._wakeup.set()

    def _release(self, request_id: str) -> None:
        with self._lock:
            self._streams.pop(request_id, None)

    def stop_accepting(self) -> None:
        """New requests get EngineDrainingError from now on; the ones in flight carry on."""
        self._accepting = False

    async def shutdown(self, timeout: float = 30.0) -> None:
        """Stops accepting, lets in-flight requests finish for up to `timeout` seconds, aborts the
        rest (their streams end with finish_reason "abort"), then stops the engine thread."""
        self._accepting = False
        deadline = time.monotonic() + timeout
        while self.num_in_flight() and time.monotonic() < deadline and self._thread.is_alive():
            await asyncio.sleep(0.05)
        with self._lock:
            left = list(self._streams)
        if left:
            logger.warning("shutdown timeout (%.1f s) passed; aborting %d request(s) still in flight",
                           timeout, len(left))
        for request_id in left:
            self._send(_Abort(request_id))
        self._stop = True
        self._wakeup.set()
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 10.0)

    # -- engine thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        # Inference mode is per thread: the whole loop runs under it (no autograd bookkeeping, and the
        # sampler may update the runner's inference-mode logits in place).
        with torch.inference_mode():
            self._loop()

    def _loop(self) -> None:
        engine = self.engine
        try:
            while not self._stop:
                # Cleared before the inbox is read, so a command sent after the read still wakes us.
                self._wakeup.clear()
                self._drain_inbox()
                if not engine.has_unfinished_requests():
                    self._wakeup.wait(0.5)
                    check_health = getattr(engine, "check_health", None)
                    if check_health is not None:   # a worker rank that died while idle: fatal now, not at the next request
                        check_health()
                    continue
                try:
                    outputs = engine.step()
                except Exception as e:  # a failed step fails the requests it ran, not the server
                    self._num_failed_steps_in_a_row += 1
                    if leaves_engine_unusable(e) or self._num_failed_steps_in_a_row >= MAX_CONSECUTIVE_STEP_FAILURES:
                        raise
                    logger.exception("engine step failed; failing the requests of that step")
                    self._fail_step(e)
                    continue
                self._num_failed_steps_in_a_row = 0
                # Snapshot and metrics first: a client that has just seen its token and then reads
                # /metrics must find this step counted.
                self._publish()
                self._call_hooks(outputs, engine.last_step_timing)
                for output in outputs:
                    self._deliver(output)
            self._drain_inbox()
            for request_id in engine.view.request_ids():
                self._abort(request_id)
            self._publish()
        except BaseException as e:  # the engine is unusable: fail everyone rather than hang them
            logger.critical("the engine is unusable and has stopped (%s: %s); failing every request", type(e).__name__,
                            e, exc_info=e)
            self._accepting = False
            with self._lock:
                self.error = e
                streams = list(self._streams.values())
            if self.on_dead is not None:   # first: a client told "stopped" finds the server already stopping
                self.on_dead(e)
            for s in streams:
                if isinstance(e, WorkerDiedError):   # the requests in flight failed: HTTP 500 / INTERNAL naming it
                    s.put(e)
                    continue
                s.put(EngineDeadError(f"the engine stopped after an error ({type(e).__name__}: {e}); the server "
                                      "is restarting, retry against another replica"))

    def _deliver(self, output: RequestOutput) -> None:
        with self._lock:
            s = self._streams.get(output.request_id)
        if s is not None:
            s.put(output)

    def _call_hooks(self, outputs: list[RequestOutput], timing: dict | None) -> None:
        for hook in self.step_hooks:
            try:
                hook(outputs, timing)
            except Exception:
                logger.exception("step hook failed")

    def _abort(self, request_id: str) -> None:
        output = self.engine.abort_request(request_id)
        if output is not None:
            self._call_hooks([output], None)
            self._deliver(output)   # a server-side abort (shutdown) ends the stream; a client's finds none

    def _drain_inbox(self) -> None:
        num_adds = num_commands = 0
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                break
            num_commands += 1
            if isinstance(command, _Add):
                num_adds += 1
                with self._lock:
                    alive = command.request_id in self._streams
                if not alive:
                    continue    # the client left before the engine saw the request
                try:
                    self.engine.add_request(command.request_id, prompt=command.prompt, params=command.params,
                                            prompt_token_ids=command.prompt_token_ids,
                                            arrival_time=command.arrival_time, priority=command.priority,
                                            output_kind="delta",
                                            **({} if command.lora_request is None else
                                               {"lora_request": command.lora_request}))
                except Exception as e:  # this request alone fails
                    command.stream.put(e)
            else:
                self._abort(command.request_id)
        if num_commands:
            # Publish before un-counting the adds, so the queue bound always sees them in one place.
            self._publish()
        if num_adds:
            with self._lock:
                self._num_pending_adds -= num_adds

    def _fail_step(self, error: Exception) -> None:
        """Fails the requests the failed step was running (the scheduler's running batch; the step was
        cancelled, so it is as before the step); waiting requests carry on. Their blocks are freed."""
        view = self.engine.view
        ids = {view.request_of_seq(seq_id) for seq_id in view.scheduler.running_ids()}
        request_ids = [found[0] for found in ids if found is not None]
        self._fail_all(error, request_ids or None)

    def _fail_all(self, error: Exception, request_ids: list[str] | None = None) -> None:
        for request_id in request_ids if request_ids is not None else self.engine.view.request_ids():
            output = self.engine.abort_request(request_id)
            with self._lock:
                s = self._streams.get(request_id)
            if s is not None:
                s.put(StepFailedError(f"the engine step running this request failed ({type(error).__name__}: "
                                      f"{error}); the server goes on, retry the request"))
            if output is not None:
                self._call_hooks([output], None)
        self._publish()

    def _publish(self) -> None:
        st = self.engine.view.scheduler_stats()
        self.snapshot = EngineSnapshot(
            num_running=st.num_running, num_waiting=st.num_waiting, num_swapped=st.num_swapped,
            kv_cache_usage=st.kv_cache_usage, prefix_query_tokens=st.prefix_query_tokens,
            prefix_hit_tokens=st.prefix_hit_tokens, num_preemptions=st.num_preemptions, num_steps=st.num_steps)
