"""DPLLMEngine: D engine replicas behind the LLMEngine calls the offline `LLM` makes
(`LLM(..., data_parallel_size=2)`): add_request routes each request to a replica (dp_router.py),
step() steps every replica that has work at the same time and returns all their outputs, so
LLM.generate() splits one call across the replicas and still returns outputs in input order.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from collections.abc import Sequence

from pagedcore.config import EngineConfig
from pagedcore.distributed.dp_replicas import load_replicas, routing_prompt
from pagedcore.distributed.dp_router import DPRouter, scheduler_probe
from pagedcore.outputs import RequestOutput


class DPLLMEngine:
    """Not thread-safe, like LLMEngine: one thread calls it; it runs the replicas' steps on its pool."""

    def __init__(self, config: EngineConfig, replicas: list | None = None):
        self.config = config
        self.replicas = replicas if replicas is not None else load_replicas(config)
        self.router = DPRouter([scheduler_probe(r.scheduler) for r in self.replicas])
        self._owner: dict[str, tuple[int, int]] = {}   # request id -> (replica, prompt tokens counted in its load)
        self._pool = ThreadPoolExecutor(len(self.replicas), thread_name_prefix="pagedcore-dp-step")

    # -- what LLM reads ----------------------------------------------------------------------------------
    @property
    def view(self):
        """Replica 0's view: the model's fixed facts (tokenizer, chat template, config) are the same on all."""
        return self.replicas[0].view

    @property
    def tokenizer(self):
        return self.replicas[0].tokenizer

    @property
    def model_config(self):
        return self.replicas[0].model_config

    # -- requests ------------------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | None = None, params=None,
                    prompt_token_ids: Sequence[int] | None = None, lora_request=None, **options) -> int:
        """LLMEngine.add_request on the replica the router picks; returns that replica's index."""
        if request_id in self._owner:
            raise ValueError(f"request id {request_id!r} is already in use")
        ids, probe_ids, adapter_id = routing_prompt(self.replicas[0], prompt, prompt_token_ids, params, lora_request)
        replica = self.router.choose(probe_ids, adapter_id).replica
        self.replicas[replica].add_request(request_id, prompt=prompt, params=params, prompt_token_ids=ids,
                                           lora_request=lora_request, **options)
        num_tokens = len(ids) if ids is not None else 0
        self.router.routed(replica, num_tokens)
        self._owner[request_id] = (replica, num_tokens)
        return replica

    def abort_request(self, request_id: str) -> RequestOutput | None:
        found = self._owner.pop(request_id, None)
        if found is None:
            return None
        replica, num_tokens = found
        self.router.finished(replica, num_tokens)
        return self.replicas[replica].abort_request(request_id)

    def has_unfinished_requests(self) -> bool:
        return any(r.has_unfinished_requests() for r in self.replicas)

    @property
    def num_unfinished_requests(self) -> int:
        return sum(r.num_unfinished_requests for r in self.replicas)

    # -- the step ------------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One step of every replica with unfinished requests, run at the same time (each blocks on its
        own rank processes); their outputs, replica by replica."""
        busy = [r for r in self.replicas if r.has_unfinished_requests()]
        if len(busy) <= 1:
            outputs = busy[0].step() if busy else []
        else:
            futures = [self._pool.submit(r.step) for r in busy]
            outputs = []
            for future in futures:   # every step ends before an error is raised: no replica is left mid-step
                future.exception()
            for future in futures:
                outputs += future.result()
        for output in outputs:
            if output.finished:
                found = self._owner.pop(output.request_id, None)
                if found is not None:
                    self.router.finished(*found)
        return outputs

    def shutdown(self) -> None:
        """Stops every replica's ranks. Idempotent."""
        self._pool.shutdown(wait=True)
        for replica in self.replicas:
            replica.shutdown()
