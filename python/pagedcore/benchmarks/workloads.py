"""Benchmark workloads: lists of requests as token ids, so every engine gets exactly the same input.

Four kinds, all deterministic for a given seed:
    synthetic      lognormal prompt (16-512) and output (16-256) lengths, random token ids
    shared-prefix  one system prompt shared by every request, then a short unique question (prefix caching)
    long-prompt    prompts longer than one step's token budget (chunked prefill)
    file           a JSON file in the format of bench/workloads/workload_n128_seed0.json
    input-grounded bench/workloads/input_grounded.json: edits and summaries copying a long prompt
                   (made by benchmarks/input_grounded.py; where speculative decoding pays)
Every request has ignore_eos, so it generates exactly max_tokens tokens and runs are comparable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

WORKLOAD_KINDS = ("synthetic", "shared-prefix", "long-prompt", "file", "input-grounded")
# Token ids are drawn from [FIRST_PLAIN_TOKEN, vocab_size): the lowest ids of most vocabularies are
# special tokens (BOS/EOS/chat markers), which a plain-text prompt never holds.
FIRST_PLAIN_TOKEN = 100


@dataclass
class BenchRequest:
    prompt_token_ids: list[int]
    max_tokens: int
    ignore_eos: bool = True

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


def lognormal_lengths(rng: np.random.Generator, num: int, median: float, sigma: float,
                      low: int, high: int) -> np.ndarray:
    """num integer lengths ~ lognormal(median, sigma) clipped to [low, high] (the shared workload's law)."""
    return np.clip(np.rint(rng.lognormal(np.log(median), sigma, num)), low, high).astype(np.int64)


def _random_ids(rng: np.random.Generator, n: int, vocab_size: int) -> list[int]:
    return rng.integers(FIRST_PLAIN_TOKEN, vocab_size, n).tolist()


def synthetic(num_requests: int, vocab_size: int, seed: int = 0, prompt_median: float = 140, prompt_sigma: float = 0.8,
              min_prompt: int = 16, max_prompt: int = 512, output_median: float = 93, output_sigma: float = 0.6,
              min_output: int = 16, max_output: int = 256) -> list[BenchRequest]:
    """The shared workload's length laws (see its meta) with random token ids; no two prompts share a prefix."""
    rng = np.random.default_rng(seed)
    prompt_lens = lognormal_lengths(rng, num_requests, prompt_median, prompt_sigma, min_prompt, max_prompt)
    output_lens = lognormal_lengths(rng, num_requests, output_median, output_sigma, min_output, max_output)
    return [BenchRequest(_random_ids(rng, int(p), vocab_size), int(o)) for p, o in zip(prompt_lens, output_lens)]


def shared_prefix(num_requests: int, vocab_size: int, seed: int = 0, prefix_len: int = 512,
                  min_suffix: int = 16, max_suffix: int = 128, min_output: int = 16,
                  max_output: int = 128) -> list[BenchRequest]:
    """A prefix_len-token system prompt shared by all requests + a unique suffix: with prefix caching
    only the first request computes the prefix (minus the last partial block)."""
    rng = np.random.default_rng(seed)
    prefix = _random_ids(rng, prefix_len, vocab_size)
    requests = []
    for _ in range(num_requests):
        suffix = _random_ids(rng, int(rng.integers(min_suffix, max_suffix + 1)), vocab_size)
        requests.append(BenchRequest(prefix + suffix, int(rng.integers(min_output, max_output + 1))))
    return requests


def long_prompt(num_requests: int, vocab_size: int, seed: int = 0, prompt_len: int = 3000,
                output_len: int = 32) -> list[BenchRequest]:
    """Prompts longer than the default 2048-token step budget: each is prefilled in chunks."""
    rng = np.random.default_rng(seed)
    return [BenchRequest(_random_ids(rng, prompt_len, vocab_size), output_len) for _ in range(num_requests)]


def from_file(path: str, num_requests: int | None = None) -> list[BenchRequest]:
    """Reads {"requests": [{"prompt_token_ids": [...], "max_tokens": N, "ignore_eos": true}, ...]}."""
    with open(path) as f:
        data = json.load(f)
    items = data["requests"] if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise ValueError(f"{path}: expected {{'requests': [...]}} with at least one request")
    requests = []
    for i, item in enumerate(items[:num_requests]):
        if "prompt_token_ids" not in item or "max_tokens" not in item:
            raise ValueError(f"{path}: request {i} needs 'prompt_token_ids' and 'max_tokens' (the format of "
                             "bench/workloads/workload_n128_seed0.json)")
        requests.append(BenchRequest([int(t) for t in item["prompt_token_ids"]], int(item["max_tokens"]),
                                     bool(item.get("ignore_eos", True))))
    return requests


def to_file(requests: list[BenchRequest], path: str, meta: dict | None = None) -> None:
    """Writes requests in the shared workload format (what the peer scripts read)."""
    data = {"meta": meta or {}, "requests": [
        {"id": i, "prompt_token_ids": r.prompt_token_ids, "max_tokens": r.max_tokens, "ignore_eos": r.ignore_eos}
        for i, r in enumerate(requests)]}
    with open(path, "w") as f:
        json.dump(data, f)


def make_workload(kind: str, vocab_size: int, num_requests: int | None = None, seed: int = 0,
                  path: str | None = None, **lengths) -> list[BenchRequest]:
    """The CLI's entry: kind in WORKLOAD_KINDS; lengths override the kind's defaults (None = default)."""
    lengths = {k: v for k, v in lengths.items() if v is not None}
    if kind == "file":
        if not path:
            raise ValueError("--workload file needs --workload-file PATH (e.g. bench/workloads/workload_n128_seed0.json)")
        return from_file(path, num_requests)
    if kind == "input-grounded":
        from pathlib import Path
        return from_file(str(Path(__file__).resolve().parents[3] / "bench/workloads/input_grounded.json"),
                         num_requests)
    if kind == "synthetic":
        return synthetic(num_requests or 128, vocab_size, seed, **lengths)
    if kind == "shared-prefix":
        return shared_prefix(num_requests or 64, vocab_size, seed, **lengths)
    if kind == "long-prompt":
        return long_prompt(num_requests or 8, vocab_size, seed, **lengths)
    raise ValueError(f"unknown workload {kind!r}; choose one of {', '.join(WORKLOAD_KINDS)}")


def summarize(requests: list[BenchRequest]) -> dict:
    prompt = [r.prompt_len for r in requests]
    output = [r.max_tokens for r in requests]
    return {"num_requests": len(requests), "prompt_tokens": int(sum(prompt)), "output_tokens": int(sum(output)),
            "prompt_len_median": float(np.median(prompt)), "output_len_median": float(np.median(output)),
            "max_prompt_len": int(max(prompt)), "max_output_len": int(max(output))}
