"""Workload: synthetic request streams for the model-free simulation (and the page's workload button).

Prompts are token ids: `num_prefix_groups` system prompts of `shared_prefix_len` tokens, each request
taking one of them followed by its own random tokens, so prefix caching has something to share.
Lengths are drawn uniformly in [min, max]: a mixed-length workload, where continuous batching wins.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Request:
    request_id: str
    arrival: float                 # seconds from the start
    prompt_token_ids: np.ndarray   # int64 [num_prompt_tokens]
    max_tokens: int                # generated exactly (ignore_eos): output lengths are the workload's


@dataclass
class WorkloadSpec:
    num_requests: int = 1000
    request_rate: float = 0.0      # requests per second (Poisson arrivals); 0 = all arrive at once
    min_prompt_len: int = 32       # tokens after the shared prefix
    max_prompt_len: int = 512
    min_output_len: int = 8
    max_output_len: int = 256
    shared_prefix_len: int = 0     # tokens of the system prompt requests share (0 = none)
    num_prefix_groups: int = 1     # distinct system prompts
    seed: int = 0

    def __post_init__(self):
        def need(ok: bool, what: str):
            if not ok:
                raise ValueError(f"WorkloadSpec: {what}")

        need(self.num_requests >= 1, f"num_requests must be >= 1, got {self.num_requests}")
        need(self.request_rate >= 0, f"request_rate must be >= 0 (0 = all at once), got {self.request_rate}")
        need(1 <= self.min_prompt_len <= self.max_prompt_len,
             f"need 1 <= min_prompt_len ({self.min_prompt_len}) <= max_prompt_len ({self.max_prompt_len})")
        need(1 <= self.min_output_len <= self.max_output_len,
             f"need 1 <= min_output_len ({self.min_output_len}) <= max_output_len ({self.max_output_len})")
        need(self.shared_prefix_len >= 0 and self.num_prefix_groups >= 1,
             "shared_prefix_len must be >= 0 and num_prefix_groups >= 1")

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def max_request_len(self) -> int:
        return self.shared_prefix_len + self.max_prompt_len + self.max_output_len


def make_workload(spec: WorkloadSpec) -> list[Request]:
    rng = np.random.default_rng(spec.seed)
    n = spec.num_requests
    if spec.request_rate > 0:
        arrivals = np.cumsum(rng.exponential(1.0 / spec.request_rate, n))
        arrivals -= arrivals[0]
    else:
        arrivals = np.zeros(n)
    prefixes = rng.integers(10_000, 20_000, (spec.num_prefix_groups, spec.shared_prefix_len))
    groups = rng.integers(0, spec.num_prefix_groups, n)
    prompt_lens = rng.integers(spec.min_prompt_len, spec.max_prompt_len + 1, n)
    output_lens = rng.integers(spec.min_output_len, spec.max_output_len + 1, n)
    requests = []
    for i in range(n):
        own = rng.integers(20_000, 30_000, int(prompt_lens[i]))
        requests.append(Request(f"r{i}", float(arrivals[i]), np.concatenate([prefixes[groups[i]], own]),
                                int(output_lens[i])))
    return requests
