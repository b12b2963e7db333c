"""DPRouter: which data-parallel replica takes a new request.

The rule, in order:
  1. Balance guard: only replicas whose load (unfinished requests routed to them) is within
     `balance_slack` of the least loaded one are candidates. Without it, a system prompt shared by
     every request would pin all traffic to the replica that cached it first.
  2. Longest cached prefix: among the candidates, the replica whose prefix cache holds the most
     leading tokens of the prompt under the request's CacheKey (adapter, cache_salt): that many
     prompt tokens skip their prefill there. A read-only C++ probe per replica
     (Scheduler.num_cached_prefix_tokens: the same chained block hashes an admission computes).
  3. Least loaded: fewest unfinished requests, then fewest unfinished prompt tokens.
  4. Lowest replica index: the choice is a pure function of the probes and loads (deterministic).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

# probe(prompt_token_ids, adapter_id, cache_salt) -> prompt tokens the replica's prefix cache holds
PrefixProbe = Callable[[Sequence[int], int, int], int]

# Requests a prefix-holding replica may carry beyond the least loaded one before the router stops
# preferring it: a few requests' worth, so a hot prefix spreads to a second replica early.
DEFAULT_BALANCE_SLACK = 2


@dataclass
class ReplicaLoad:
    """What the router knows of one replica's queue: kept by the owner of the replicas (dp_engine,
    dp_offline), +1 / + prompt tokens when a request is routed, - when it ends."""
    num_requests: int = 0
    num_prompt_tokens: int = 0


@dataclass(frozen=True)
class RouteDecision:
    replica: int
    num_cached_tokens: int          # the prompt's prefix cached on the chosen replica
    reason: str                     # "prefix" (the longest prefix decided) or "load"


class DPRouter:
    def __init__(self, probes: Sequence[PrefixProbe], balance_slack: int = DEFAULT_BALANCE_SLACK):
        if not probes:
            raise ValueError("a data-parallel router needs at least one replica")
        if isinstance(balance_slack, bool) or not isinstance(balance_slack, int) or balance_slack < 0:
            raise ValueError(f"balance_slack must be an integer >= 0, got {balance_slack!r}")
        self.probes = list(probes)
        self.balance_slack = balance_slack
        self.loads = [ReplicaLoad() for _ in probes]

    @property
    def num_replicas(self) -> int:
        return len(self.probes)

    def choose(self, prompt_token_ids: Sequence[int] | None, adapter_id: int = 0, cache_salt: int = 0,
               exclude: Sequence[int] = ()) -> RouteDecision:
        """The replica for a new request (not yet counted in the loads: call routed() once it is added).
        prompt_token_ids None: the prompt cannot hit any cache (prefix caching off, or a request salted
        off the cache): load decides. exclude: replicas to skip (found full); all excluded -> ValueError."""
        candidates = [i for i in range(self.num_replicas) if i not in exclude]
        if not candidates:
            raise ValueError("every replica was excluded")
        least = min(self.loads[i].num_requests for i in candidates)
        candidates = [i for i in candidates if self.loads[i].num_requests <= least + self.balance_slack]
        cached = {i: 0 for i in candidates}
        if prompt_token_ids is not None and len(prompt_token_ids) > 1:
            for i in candidates:
                cached[i] = int(self.probes[i](prompt_token_ids, adapter_id, cache_salt))

        def key(i: int) -> tuple:
            load = self.loads[i]
            return -cached[i], load.num_requests, load.num_prompt_tokens, i

        best = min(candidates, key=key)
        # "prefix" when the cache, not the load, made the choice.
        by_load = min(candidates, key=lambda i: (self.loads[i].num_requests, self.loads[i].num_prompt_tokens, i))
        reason = "prefix" if cached[best] > cached[by_load] else "load"
        return RouteDecision(best, cached[best], reason)

    def routed(self, replica: int, num_prompt_tokens: int) -> None:
        load = self.loads[replica]
        load.num_requests += 1
        load.num_prompt_tokens += num_prompt_tokens

    def finished(self, replica: int, num_prompt_tokens: int) -> None:
        load = self.loads[replica]
        load.num_requests = max(0, load.num_requests - 1)
        load.num_prompt_tokens = max(0, load.num_prompt_tokens - num_prompt_tokens)


def scheduler_probe(scheduler) -> PrefixProbe:
    """The probe of one replica: its C++ scheduler's read-only prefix lookup. Safe from the event-loop
    thread while the replica's engine thread steps: no Scheduler method releases the GIL, so the probe
    runs between (never inside) that thread's schedule() and update() (bind_scheduler.cc)."""
    import numpy as np

    def probe(prompt_token_ids: Sequence[int], adapter_id: int, cache_salt: int) -> int:
        ids = np.asarray(prompt_token_ids, dtype=np.int64)   # [num_prompt_tokens]
        return scheduler.num_cached_prefix_tokens(ids, adapter_id=adapter_id, cache_salt=cache_salt)

    return probe
