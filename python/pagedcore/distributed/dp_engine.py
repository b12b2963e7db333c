"""DPAsyncLLMEngine: D AsyncLLMEngines (one engine thread each) behind the interface the servers use.

    HTTP / gRPC handler ──add_request──▶ DPRouter (longest cached prefix, else least loaded)
                                          ├──▶ replica 0: AsyncLLMEngine (engine thread) ──▶ its ranks
                                          └──▶ replica 1: AsyncLLMEngine (engine thread) ──▶ its ranks

Per request: routed to one replica, which streams it back. Global: health (every replica must be up;
one that dies stops the server, as a dead single engine does), queue sizes and the Prometheus gauges
(summed; KV usage averaged: every replica has the same number of blocks), the step hooks (called from
every replica's thread; metrics are thread-safe and request ids distinct). The fixed facts front ends
read through `.engine` (tokenizer, config, chat template, grammar cache) are replica 0's: the same on
all, and the grammar cache is shared (dp_replicas.load_replicas). The simulator's live trace follows
replica 0 only (server.py attaches it there and says so).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence

from pagedcore.distributed.dp_replicas import routing_prompt
from pagedcore.distributed.dp_router import DPRouter, scheduler_probe
from pagedcore.outputs import RequestOutput
from pagedcore.sampling_params import SamplingParams
from pagedcore.serving.async_engine import AsyncLLMEngine, EngineSnapshot, QueueFullError, StepHook

logger = logging.getLogger(__name__)


class DPAsyncLLMEngine:
    def __init__(self, engines: Sequence, max_queued_requests: int | None = None):
        """engines: the replicas' LLMEngines (dp_replicas.load_replicas). max_queued_requests bounds
        each replica's waiting queue; a request finding its replica full goes to the next best one."""
        self.max_queued_requests = max_queued_requests
        self.step_hooks: list[StepHook] = []
        self.on_dead: Callable[[BaseException], None] | None = None
        self.replicas = [AsyncLLMEngine(e, max_queued_requests=max_queued_requests) for e in engines]
        for index, replica in enumerate(self.replicas):
            replica.step_hooks = self.step_hooks          # one list: a hook added here sees every replica
            replica.on_dead = lambda error, i=index: self._replica_died(i, error)
        self.router = DPRouter([scheduler_probe(e.scheduler) for e in engines])
        self._lock = threading.Lock()     # guards the router's loads and _owner (event loop vs engine threads)
        self._owner: dict[str, tuple[int, int]] = {}   # request id in flight -> (replica, prompt tokens)
        self._dead_reported = False

    # -- what front ends read --------------------------------------------------------------------------------
    @property
    def engine(self):
        """Replica 0's LLMEngine, for the model's fixed facts (view, grammars, lora_manager)."""
        return self.replicas[0].engine

    @property
    def accepting(self) -> bool:
        return all(r.accepting for r in self.replicas)

    @property
    def error(self) -> BaseException | None:
        return next((r.error for r in self.replicas if r.error is not None), None)

    @property
    def snapshot(self) -> EngineSnapshot:
        """The replicas' latest snapshots summed (KV usage: the mean, every replica has as many blocks)."""
        snaps = [r.snapshot for r in self.replicas]
        return EngineSnapshot(
            num_running=sum(s.num_running for s in snaps), num_waiting=sum(s.num_waiting for s in snaps),
            num_swapped=sum(s.num_swapped for s in snaps),
            kv_cache_usage=sum(s.kv_cache_usage for s in snaps) / len(snaps),
            prefix_query_tokens=sum(s.prefix_query_tokens for s in snaps),
            prefix_hit_tokens=sum(s.prefix_hit_tokens for s in snaps),
            num_preemptions=sum(s.num_preemptions for s in snaps), num_steps=sum(s.num_steps for s in snaps))

    def num_in_flight(self) -> int:
        return sum(r.num_in_flight() for r in self.replicas)

    # -- requests --------------------------------------------------------------------------------------------
    def add_request(self, prompt: str | None = None, params: SamplingParams | None = None,
                    request_id: str | None = None, *, prompt_token_ids: Sequence[int] | None = None,
                    priority: int = 0, stream: bool = True, lora_request=None) -> _RoutedStream:
        """AsyncLLMEngine.add_request on the replica the router picks (the same errors)."""
        import uuid

        params = params or SamplingParams()
        request_id = request_id or uuid.uuid4().hex
        ids, probe_ids, adapter_id = routing_prompt(self.engine, prompt, prompt_token_ids, params, lora_request)
        num_tokens = len(ids) if ids is not None else 0
        excluded: list[int] = []
        while True:
            with self._lock:
                if request_id in self._owner:
                    raise ValueError(f"request id {request_id!r} is already in flight")
                replica = self.router.choose(probe_ids, adapter_id, exclude=excluded).replica
                self.router.routed(replica, num_tokens)
                self._owner[request_id] = (replica, num_tokens)
            try:
                inner = self.replicas[replica].add_request(prompt, params, request_id, prompt_token_ids=ids,
                                                           priority=priority, stream=stream, lora_request=lora_request)
            except BaseException as error:
                self._forget(request_id)
                if isinstance(error, QueueFullError) and len(excluded) + 1 < len(self.replicas):
                    excluded.append(replica)       # this one is full: the next best
                    continue
                raise
            return _RoutedStream(inner, lambda: self._forget(request_id))

    async def generate(self, prompt: str | None = None, params: SamplingParams | None = None,
                       request_id: str | None = None, *, prompt_token_ids: Sequence[int] | None = None,
                       priority: int = 0, stream: bool = True, lora_request=None) -> AsyncIterator[RequestOutput]:
        outputs = self.add_request(prompt, params, request_id, prompt_token_ids=prompt_token_ids,
                                   priority=priority, stream=stream, lora_request=lora_request)
        async with outputs:
            async for output in outputs:
                yield output

    async def abort(self, request_id: str) -> None:
        with self._lock:
            found = self._owner.get(request_id)
        if found is not None:
            await self.replicas[found[0]].abort(request_id)

    def _forget(self, request_id: str) -> None:
        with self._lock:
            found = self._owner.pop(request_id, None)
            if found is not None:
                self.router.finished(*found)

    # -- life cycle ------------------------------------------------------------------------------------------
    def stop_accepting(self) -> None:
        for r in self.replicas:
            r.stop_accepting()

    async def shutdown(self, timeout: float = 30.0) -> None:
        """Every replica drains at once (AsyncLLMEngine.shutdown), within the one timeout."""
        await asyncio.gather(*(r.shutdown(timeout) for r in self.replicas))

    def _replica_died(self, index: int, error: BaseException) -> None:
        """On the dead replica's thread. The whole server goes down, as with one engine: a replica short of
        its model cannot serve, and a supervisor restarting the process restores all D."""
        logger.critical("data-parallel replica %d is unusable (%s: %s); stopping every replica", index,
                        type(error).__name__, error)
        self.stop_accepting()
        with self._lock:
            first, self._dead_reported = not self._dead_reported, True
        if first and self.on_dead is not None:
            self.on_dead(error)


class _RoutedStream:
    """A replica's RequestStream that also tells the DP engine when the request is done (for the router's
    load and the id's uniqueness). The same async-iterator / async-context interface."""

    def __init__(self, inner, on_done: Callable[[], None]):
        self._inner = inner
        self._on_done = on_done
        self.request_id = inner.request_id

    def __aiter__(self) -> _RoutedStream:
        return self

    async def __anext__(self) -> RequestOutput:
        try:
            output = await self._inner.__anext__()
        except Exception:            # the end (StopAsyncIteration) or this request's error; not a cancel
            self._on_done()
            raise
        if output.finished:
            self._on_done()
        return output

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._on_done()

    async def __aenter__(self) -> _RoutedStream:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
