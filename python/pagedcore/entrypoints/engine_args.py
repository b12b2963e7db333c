"""Engine flags for every command line (vLLM's names), turned into an EngineConfig."""

from __future__ import annotations

import argparse

from pagedcore.config import EngineConfig


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine")
    # float16 / half are accepted here only to be refused by EngineConfig with the fix (vLLM users pass them).
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16", "half"],
                   help="weights, activations and KV cache dtype. auto (default): a GGUF keeps its quantized "
                        "blocks (fp32 activations), an HF folder runs float32 (a bf16 / fp16 checkpoint's "
                        "weights held as stored: the same results, half the bytes); float32 | bfloat16: a GGUF "
                        "is dequantised at load (float32 is token-exact with HF transformers). float16 / half "
                        "(fp16 activations) are refused. On a GPU auto means float32 (docs/quantization.md)")
    g.add_argument("--quantization", "-q", default=None,
                   help="gguf (a .gguf file's blocks as stored; what auto does), int8_per_channel (a dense "
                        "checkpoint quantized to int8 at load, W8A8), fp8 (an fp8 checkpoint, or a dense one "
                        "quantized to fp8 e4m3 at load; weight-only), gptq / awq / compressed-tensors (an HF "
                        "folder stored quantized, also found from its config.json when unset); see "
                        "docs/quantization.md")
    g.add_argument("--max-model-len", type=int, default=None,
                   help="longest prompt + output in tokens (default: the model's context length, at most 8192)")
    g.add_argument("--max-num-seqs", type=int, default=256, help="most sequences in one step")
    g.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="token budget of one step (default 2048); larger steps batch bigger GEMMs")
    g.add_argument("--block-size", type=int, default=None,
                   help="tokens per KV cache block (default: 128 on the CPU, as vLLM-CPU; 16 on a GPU or with "
                        "a draft model's speculation)")
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
    g.add_argument("--num-gpu-blocks-override", type=int, default=None, metavar="N",
                   help="exactly N KV cache blocks, whatever the memory flags say (vLLM's flag; on the CPU too): "
                        "makes preemption reproducible across machines")
    g.add_argument("--kv-cache-memory-bytes", default=None, metavar="BYTES",
                   help="vLLM's name for --kv-cache-memory (bytes or a size like 4GiB); give one of the two")
    g.add_argument("--kv-cache-commit", default="background", choices=["background", "startup"],
                   help="when the CPU KV cache's memory is made resident: on a thread while the engine already "
                        "serves (default; on a VM that backs memory on first touch, 4 GiB took 10-22 s), or "
                        "before start-up ends (benchmarks: nothing else running from the first step)")
    g.add_argument("--kv-cache-dtype", default="auto",
                   help="KV cache dtype (vLLM's flag): auto (the activations' dtype), bfloat16, float32, fp8 (= "
                        "fp8_e4m3) or fp8_e5m2; a bfloat16 cache under float32 activations (e.g. a GGUF run as "
                        "stored) halves the cache's bytes, fp8 halves bf16's (values rounded to OCP fp8, scale 1, "
                        "saturated; the CPU in-process engine only)")
    g.add_argument("--cpu-offload-gb", type=float, default=0.0,
                   help="vLLM's weight offload to CPU memory: only 0 is supported (on the CPU the weights are "
                        "already in CPU memory)")
    g.add_argument("--device", default="cpu", help="cpu or cuda[:N] (CUDA needs a build with the CUDA kernels)")
    g.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="on a GPU: the share of its memory for weights, activations and the KV cache (default "
                        "0.9); refused on the CPU, whose KV cache --kv-cache-memory sizes")
    g.add_argument("--num-threads", type=int, default=None, help="CPU threads for torch and the kernels (default: all cores)")
    g.add_argument("--seed", type=int, default=0, help="seed of the sampling generator for unseeded requests")
    g.add_argument("--max-logprobs", type=int, default=20, help="the most logprobs a request may ask for")
    g.add_argument("--speculative-config", default=None, metavar="JSON",
                   help='speculative decoding, vLLM\'s config as JSON: \'{"method": "ngram", '
                        '"num_speculative_tokens": 4, "prompt_lookup_max": 4}\' (docs/speculative-decoding.md)')
    g.add_argument("--num-scheduler-steps", type=int, default=1,
                   help="multi-step scheduling (vLLM's flag): greedy decodes run up to N tokens a sequence per "
                        "scheduler step in one call, streamed N at a time (docs/multi-step.md)")
    dist = parser.add_argument_group("parallelism (docs/distributed.md)")
    dist.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                      help="ranks that split every layer (attention heads, MLP columns, vocabulary); one all-reduce "
                           "after attention and after the MLP")
    dist.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1,
                      help="stages that each run a contiguous range of layers, micro-batches in flight")
    dist.add_argument("--data-parallel-size", "-dp", type=int, default=1,
                      help="whole engine replicas behind one endpoint; a request goes to the replica holding "
                           "its longest cached prefix, else the least loaded")
    dist.add_argument("--distributed-executor-backend", default=None, choices=["mp", "ray"],
                      help="mp: worker processes on this machine (default); ray: Ray actors on the Ray cluster "
                           "this process joins (start it with `ray start --head`)")
    lora = parser.add_argument_group("LoRA adapters (docs/lora.md)")
    lora.add_argument("--enable-lora", action="store_true", help="serve PEFT LoRA adapters over the base model")
    lora.add_argument("--max-loras", type=int, default=1,
                      help="most distinct adapters in one step (default 1); more wait a step")
    lora.add_argument("--max-lora-rank", type=int, default=16, help="largest adapter rank accepted (default 16)")
    lora.add_argument("--max-cpu-loras", type=int, default=None,
                      help="adapters kept loaded, least recently used evicted (default: --max-loras)")


def _check_cache_flags(args: argparse.Namespace) -> None:
    """vLLM's cache flags this engine cannot honour: refused by name, never silently ignored."""
    if getattr(args, "cpu_offload_gb", 0):
        raise ValueError(f"--cpu-offload-gb {args.cpu_offload_gb} is not supported (no weight offload); drop it")
    if getattr(args, "kv_cache_memory_bytes", None) is not None:
        if args.kv_cache_memory is not None:
            raise ValueError("--kv-cache-memory and --kv-cache-memory-bytes size the same cache; give one")
        args.kv_cache_memory = args.kv_cache_memory_bytes
    device = str(getattr(args, "device", "cpu"))
    if getattr(args, "gpu_memory_utilization", None) is not None and not device.startswith("cuda"):
        raise ValueError(f"--gpu-memory-utilization applies to a GPU, and --device is {device}; size the KV cache "
                         "with --kv-cache-memory (or --num-gpu-blocks-override) instead")


def engine_config_from_args(args: argparse.Namespace, **overrides) -> EngineConfig:
    _check_cache_flags(args)
    fields = dict(
        model=getattr(args, "model", None), dtype=args.dtype, quantization=args.quantization,
        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, block_size=args.block_size,
        enable_prefix_caching=args.enable_prefix_caching, enable_chunked_prefill=args.enable_chunked_prefill,
        preemption_mode=args.preemption_mode, swap_space=args.swap_space,
        scheduling_policy=args.scheduling_policy, kv_cache_memory=args.kv_cache_memory,
        num_threads=args.num_threads, seed=args.seed, max_logprobs=args.max_logprobs, device=args.device,
        kv_cache_dtype=getattr(args, "kv_cache_dtype", None) or "auto",
        kv_cache_commit=getattr(args, "kv_cache_commit", None) or "background",
        speculative_config=getattr(args, "speculative_config", None),
        num_scheduler_steps=getattr(args, "num_scheduler_steps", 1),
        enable_lora=getattr(args, "enable_lora", False), max_loras=getattr(args, "max_loras", 1),
        max_lora_rank=getattr(args, "max_lora_rank", 16), max_cpu_loras=getattr(args, "max_cpu_loras", None),
        gpu_memory_utilization=0.9 if args.gpu_memory_utilization is None else args.gpu_memory_utilization,
        num_gpu_blocks_override=getattr(args, "num_gpu_blocks_override", None),
        tensor_parallel_size=getattr(args, "tensor_parallel_size", 1),
        pipeline_parallel_size=getattr(args, "pipeline_parallel_size", 1),
        data_parallel_size=getattr(args, "data_parallel_size", 1),
        distributed_executor_backend=getattr(args, "distributed_executor_backend", None))
    fields.update(overrides)
    return EngineConfig(**fields)
