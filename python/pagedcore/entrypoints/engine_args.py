"""Engine flags for every command line (vLLM's names), turned into an EngineConfig."""

from __future__ import annotations

import argparse

from pagedcore.config import EngineConfig


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "auto"],
                   help="weights, activations and KV cache dtype (auto = float32 on the CPU)")
    g.add_argument("--max-model-len", type=int, default=None,
                   help="longest prompt + output in tokens (default: the model's context length, at most 8192)")
    g.add_argument("--max-num-seqs", type=int, default=256, help="most sequences in one step")
    g.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="token budget of one step (default 2048); larger steps batch bigger GEMMs")
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV cache block")
    g.add_argument("--enable-prefix-caching", dest="enable_prefix_caching", action="store_true", default=True,
                   help="reuse the KV of shared prompt prefixes (default on)")
    g.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false",
                   help="turn prefix caching off")
    g.add_argument("--no-enable-chunked-prefill", dest="enable_chunked_prefill", action="store_false",
                   default=True, help="prefill each prompt in one step instead of chunks under the budget")
    g.add_argument("--preemption-mode", default="recompute", choices=["recompute", "swap"],
                   help="when the KV cache is full: drop a sequence's KV and recompute it later, or swap it to CPU memory")
    g.add_argument("--swap-space", default="1GiB", help="CPU memory for swapped-out KV blocks (with --preemption-mode swap)")
    g.add_argument("--scheduling-policy", default="fcfs", choices=["fcfs", "priority"],
                   help="order of service: arrival, or the request's priority (lower first) then arrival")
    g.add_argument("--kv-cache-memory", default=None,
                   help="KV cache size: bytes, a size like 4GiB, or a fraction of available memory (default 4GiB, at most 40%%)")
    g.add_argument("--device", default="cpu", help="cpu or cuda[:N] (CUDA needs a build with the CUDA kernels)")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="on a GPU: the share of its memory for weights, activations and the KV cache")
    g.add_argument("--num-threads", type=int, default=None, help="CPU threads for torch and the kernels (default: all cores)")
    g.add_argument("--seed", type=int, default=0, help="seed of the sampling generator for unseeded requests")
    g.add_argument("--max-logprobs", type=int, default=20, help="the most logprobs a request may ask for")


def engine_config_from_args(args: argparse.Namespace, **overrides) -> EngineConfig:
    fields = dict(
        model=getattr(args, "model", None), dtype="float32" if args.dtype == "auto" else args.dtype,
        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, block_size=args.block_size,
        enable_prefix_caching=args.enable_prefix_caching, enable_chunked_prefill=args.enable_chunked_prefill,
        preemption_mode=args.preemption_mode, swap_space=args.swap_space,
        scheduling_policy=args.scheduling_policy, kv_cache_memory=args.kv_cache_memory,
        num_threads=args.num_threads, seed=args.seed, max_logprobs=args.max_logprobs, device=args.device,
        gpu_memory_utilization=args.gpu_memory_utilization)
    fields.update(overrides)
    return EngineConfig(**fields)
