"""`pagedcore bench {throughput,latency,serve,roofline,allreduce,...}`: registered by pagedcore.cli when present.

Only argparse lives here: each command's module (and torch with it) is imported when the command
runs, so registering `bench` costs the other `pagedcore` commands nothing.
"""

from __future__ import annotations

import argparse
import importlib
import math

from pagedcore.benchmarks.workloads import WORKLOAD_KINDS


def _rate(text: str) -> float:
    return math.inf if text.lower() in ("inf", "infinity") else float(text)


def add_workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument("--workload", default="synthetic", metavar="KIND_OR_FILE",
                   help="synthetic (lognormal lengths), shared-prefix (prefix caching), long-prompt "
                        "(chunked prefill), file (--workload-file), or the path of a .json workload itself")
    g.add_argument("--workload-file", default=None,
                   help="JSON of token ids in the format of bench/workloads/workload_n128_seed0.json (implies --workload file)")
    g.add_argument("--num-prompts", type=int, default=None,
                   help="requests (default: 128 synthetic, 64 shared-prefix, 8 long-prompt, all of a file)")
    g.add_argument("--seed-workload", type=int, default=0, help="seed of the synthetic workloads")
    g.add_argument("--min-prompt-len", type=int, default=None, help="synthetic: shortest prompt (16)")
    g.add_argument("--max-prompt-len", type=int, default=None,
                   help="synthetic: longest prompt (512); long-prompt: the prompt length (3000)")
    g.add_argument("--min-output-len", type=int, default=None, help="synthetic: shortest output (16)")
    g.add_argument("--max-output-len", type=int, default=None,
                   help="synthetic: longest output (256); shared-prefix: longest output (128); long-prompt: output (32)")
    g.add_argument("--prefix-len", type=int, default=None, help="shared-prefix: tokens of the shared system prompt (512)")


def _command(module: str, function: str):
    def run(args):
        kind = getattr(args, "workload", None)
        if kind is not None and kind not in WORKLOAD_KINDS:
            if not kind.endswith(".json"):
                raise ValueError(f"--workload {kind!r}: give one of {', '.join(WORKLOAD_KINDS)} or a .json file")
            args.workload_file = kind          # `--workload FILE.json` reads as --workload-file FILE.json
        if getattr(args, "workload_file", None):
            args.workload = "file"
        return getattr(importlib.import_module(f"pagedcore.benchmarks.{module}"), function)(args)
    return run


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    from pagedcore.entrypoints.engine_args import add_engine_args

    bench = subparsers.add_parser("bench", help="benchmarks: throughput, latency, serve, roofline")
    sub = bench.add_subparsers(dest="bench_command", required=True)

    p = sub.add_parser("throughput", help="offline throughput: a whole workload submitted at once")
    p.add_argument("--model", default=None, help="HF folder or .gguf file (default: the bundled SmolLM2-135M-Instruct)")
    add_workload_args(p)
    p.add_argument("--num-runs", type=int, default=1, help="timed runs after the warm-up (the median is reported)")
    p.add_argument("--no-roofline", action="store_true", help="skip measuring this machine's GEMM rate for the floor")
    p.add_argument("--gemm-gflops", type=float, default=None,
                   help="use this GEMM rate for the floor instead of measuring it (GFLOP/s at the run's dtype)")
    p.add_argument("--profile-ops", action="store_true", help="also time every Linear (adds ~0.5 ms a step)")
    # vLLM's benchmark_serving names; the default (temperature 0) is the fixed workload's greedy decoding.
    p.add_argument("--temperature", type=float, default=0.0, help="every request's temperature (0 = greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="every request's top_p")
    p.add_argument("--top-k", type=int, default=0, help="every request's top_k (0 = off)")
    p.add_argument("--min-p", type=float, default=0.0, help="every request's min_p")
    p.add_argument("--output-json", default=None, help="write the result here")
    add_engine_args(p)
    p.set_defaults(func=_command("throughput", "cmd_throughput"))

    p = sub.add_parser("latency", help="one request's TTFT/TPOT and the decode step at batch 1/16/64")
    p.add_argument("--model", default=None, help="HF folder or .gguf file (default: the bundled model)")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens")
    p.add_argument("--output-len", type=int, default=128, help="output tokens of the single request")
    p.add_argument("--num-iters", type=int, default=3, help="timed single-request runs (median reported)")
    p.add_argument("--batch-sizes", type=int, nargs="*", default=[1, 16, 64], help="decode batch sizes to time")
    p.add_argument("--decode-steps", type=int, default=20, help="timed decode steps per batch size")
    p.add_argument("--bandwidth-gbps", type=float, default=None,
                   help="memory bandwidth for the decode floor (default: measure the copy rate here)")
    p.add_argument("--gemm-gflops", type=float, default=None,
                   help="GEMM rate for the decode floor (default: measure torch's at the model's shapes here)")
    p.add_argument("--seed-workload", type=int, default=0, help="seed of the random prompts")
    p.add_argument("--workload-file", default=None,
                   help="time single-stream decode over this workload's requests instead, speculation off and on "
                        "(with --speculative-config), e.g. bench/workloads/input_grounded.json")
    p.add_argument("--num-prompts", type=int, default=None, help="with --workload-file: its first N requests")
    p.add_argument("--output-json", default=None, help="write the result here")
    add_engine_args(p)
    p.set_defaults(func=_command("latency", "cmd_latency"))

    p = sub.add_parser("serve", help="load-test an OpenAI-compatible server (Poisson arrivals or fixed concurrency)")
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server (default: pagedcore serve's)")
    p.add_argument("--model", default=None, help="model name for the requests (default: the first of /v1/models)")
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    add_workload_args(p)
    p.add_argument("--request-rate", type=_rate, nargs="+", default=[math.inf],
                   help="requests per second, Poisson arrivals ('inf' = all at once); several values make a sweep")
    p.add_argument("--max-concurrency", "--concurrency", type=int, default=None, help="most requests in flight at once")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before a request counts as failed")
    p.add_argument("--vocab-size", type=int, default=49152,
                   help="token ids of synthetic workloads are drawn below this (the default model's vocabulary)")
    p.add_argument("--output-json", default="bench_serve.json", help="result file")
    p.add_argument("--plot-dir", default=None, help="write PNG plots here (needs matplotlib)")
    p.set_defaults(func=_command("serve", "cmd_serve"))

    p = sub.add_parser("roofline", help="machine ceilings (GEMM GFLOP/s, bandwidth) and the model's floors")
    p.add_argument("--model", default=None, help="HF folder or .gguf file (default: the bundled model)")
    add_workload_args(p)
    p.add_argument("--rows", type=int, nargs="*", default=[1, 16, 64, 256, 1024], help="GEMM row counts to time")
    p.add_argument("--bandwidth-mib", type=int, default=512,
                   help="buffer size for the bandwidth test (well above the caches)")
    p.add_argument("--min-time", type=float, default=0.3, help="seconds to time each figure (best of repeats)")
    p.add_argument("--measured", nargs="*", default=[], metavar="LABEL=DTYPE:SECONDS",
                   help="measured walls to set against the floor, e.g. pagedcore-fp32=float32:80.1")
    p.add_argument("--output-json", default=None, help="write the result here")
    p.set_defaults(func=_command("roofline_cmd", "cmd_roofline"))

    p = sub.add_parser("perplexity",
                       help="perplexity of each weight format (fp32, bf16, q8_0, q5_1, q5_0, as stored, int8, fp8) on a "
                            "fixed text")
    p.add_argument("--model", default=None, help="a .gguf file or HF folder (default: the bundled Q4_1 model)")
    p.add_argument("--ctx", type=int, default=512, help="tokens per window; the second half of each is scored")
    p.add_argument("--num-windows", type=int, default=16, help="windows from the start of the text")
    p.add_argument("--variants", nargs="+", default=["fp32", "bf16", "q8_0", "as-stored", "int8_per_channel"],
                   choices=["fp32", "bf16", "q8_0", "q5_1", "q5_0", "as-stored", "int8_per_channel", "fp8", "fp8-bf16"],
                   help="weight formats to score (fp8-bf16: fp8 weights under bf16 activations)")
    p.add_argument("--llamacpp-python", default=None,
                   help="a python with llama-cpp-python (e.g. /tmp/llama-venv/bin/python): llama.cpp's PPL side by side")
    p.add_argument("--max-num-seqs", type=int, default=16, help="windows in flight at once")
    p.add_argument("--num-threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--kv-cache-memory", default="1GiB", help="KV cache size")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "float32", "bfloat16", "fp8", "fp8_e4m3",
                                                                "fp8_e5m2"],
                   help="KV cache dtype of every variant (auto: each variant's default)")
    p.add_argument("--output-json", default=None, help="write the result here")
    p.set_defaults(func=_command("perplexity", "cmd_perplexity"))

    p = sub.add_parser("allreduce", help="tensor-parallel all-reduce latency: shared memory vs gloo, fp32 and bf16")
    p.add_argument("--hidden-size", type=int, default=576, help="columns (default: the bundled model's hidden size)")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 512], help="num_tokens values to time")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    p.add_argument("--backends", nargs="+", default=["shm", "gloo"], choices=["shm", "gloo"])
    p.add_argument("--world-size", type=int, default=2, help="rank processes")
    p.add_argument("--iters", type=int, default=500, help="timed calls per figure (median and p90 reported)")
    p.add_argument("--warmup", type=int, default=50, help="untimed calls first")
    p.add_argument("--output-json", default=None, help="write the result here")
    p.set_defaults(func=_command("allreduce", "cmd_allreduce"))

    importlib.import_module("pagedcore.benchmarks.soak").add_soak_parser(sub)
    return bench
