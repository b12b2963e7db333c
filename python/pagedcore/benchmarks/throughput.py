"""`pagedcore bench throughput`: the offline engine on a whole workload submitted at once.

Prints requests/s, output and total tokens/s, wall time, peak RSS, the KV cache size, the per-step
breakdown (where a step's time goes) and the roofline floor of the workload on this machine.
"""

from __future__ import annotations

import json
import time

from pagedcore.benchmarks import machine, roofline, stats, workloads
from pagedcore.benchmarks.engine_setup import build_engine, warm_up
from pagedcore.benchmarks.probe import StepProbe


def run_workload(engine, requests, probe_ops: bool = False, sampling: dict | None = None) -> dict:
    """Adds every request, steps until all finish, and times it all. Greedy unless sampling gives
    SamplingParams fields (temperature, top_p, ...); ignore_eos: each request generates exactly
    max_tokens tokens. Returns wall, token counts, step records and KV usage."""
    from pagedcore.sampling_params import SamplingParams

    sampling = sampling or {"temperature": 0.0}
    outputs = {}
    peak_kv_usage = 0.0
    with StepProbe(engine, ops=probe_ops) as probe:
        t0 = time.perf_counter()
        for i, r in enumerate(requests):
            params = SamplingParams(max_tokens=r.max_tokens, ignore_eos=r.ignore_eos, **sampling)
            engine.add_request(f"bench-{i}", prompt_token_ids=r.prompt_token_ids, params=params, output_kind="final")
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    outputs[out.request_id] = out
            peak_kv_usage = max(peak_kv_usage, engine.view.scheduler_stats().kv_cache_usage)
        wall = time.perf_counter() - t0
        records = probe.take()
    sched = engine.view.scheduler_stats()
    num_output = sum(len(o.token_ids) for out in outputs.values() for o in out.outputs)
    num_prompt = sum(r.prompt_len for r in requests)
    return {"wall_seconds": wall, "num_requests": len(requests), "prompt_tokens": num_prompt,
            "output_tokens": num_output, "requests_per_s": len(requests) / wall,
            "output_tok_per_s": num_output / wall, "total_tok_per_s": (num_prompt + num_output) / wall,
            "steps": records, "peak_kv_cache_usage": peak_kv_usage,
            "prefix_hit_tokens": sched.prefix_hit_tokens, "num_preemptions": sched.num_preemptions,
            "outputs": outputs}


# Step-size classes for the split by step size: decode-only steps at few / mid / full batch, and
# steps carrying prefill chunks.
STEP_SIZE_BOUNDS = ((8, "<= 8"), (64, "9-64"), (128, "65-128"), (512, "129-512"), (None, "> 512"))


def step_size_split(records: list[dict], flop_per_token: float) -> list[dict]:
    """Steps grouped by tokens scheduled: count, tokens, seconds, and the layers' effective GFLOP/s
    (linear FLOPs of the tokens over the model-forward time, attention and norms included)."""
    rows = []
    for bound, label in STEP_SIZE_BOUNDS:
        low = rows[-1]["bound"] if rows else 0
        chosen = [r for r in records if r["num_tokens"] > low and (bound is None or r["num_tokens"] <= bound)]
        tokens = sum(r["num_tokens"] for r in chosen)
        forward = sum(r["model_forward"] for r in chosen)
        rows.append({"label": label, "bound": bound if bound is not None else 1 << 62, "steps": len(chosen),
                     "tokens": tokens, "seconds": sum(r["total"] for r in chosen), "forward_seconds": forward,
                     "lm_head_seconds": sum(r["lm_head"] for r in chosen),
                     "layer_gflops": tokens * flop_per_token / forward / 1e9 if forward > 0 else 0.0})
    return [r for r in rows if r["steps"]]


def tail_summary(records: list[dict], wall: float, few: int = 8) -> dict:
    """The workload's tail: the steps where at most `few` sequences remain (small GEMMs, poor batching)."""
    tail = [r for r in records if r["num_seqs"] <= few]
    seconds = sum(r["total"] for r in tail)
    return {"max_seqs": few, "steps": len(tail), "seconds": seconds, "share_of_wall": seconds / wall if wall else 0,
            "tokens": sum(r["num_tokens"] for r in tail)}



def cmd_throughput(args) -> int:
    engine, setup = build_engine(args)
    mc = engine.view.model_config
    requests = workloads.make_workload(args.workload, mc.vocab_size, args.num_prompts, args.seed_workload,
                                       args.workload_file, **workload_lengths(args))
    max_model_len = engine.view.config.max_model_len
    too_long = [r for r in requests if r.prompt_len + r.max_tokens > max_model_len]
    if too_long:
        raise ValueError(f"{len(too_long)} request(s) need more than max_model_len={max_model_len} "
                         "tokens; raise --max-model-len or shorten the workload")
    warm_up(engine, mc.vocab_size)
    sampling = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k, "min_p": args.min_p}
    runs = [run_workload(engine, requests, args.profile_ops, sampling) for _ in range(max(1, args.num_runs))]
    runs.sort(key=lambda r: r["wall_seconds"])
    best = runs[len(runs) // 2]                      # the median run (the middle of the sorted walls)
    result = {k: v for k, v in best.items() if k not in ("steps", "outputs")}
    result["all_walls"] = [r["wall_seconds"] for r in runs]
    result["workload"] = {"kind": args.workload, "file": args.workload_file, **workloads.summarize(requests)}
    result["setup"] = setup
    result["sampling"] = sampling
    result["machine"] = machine.cpu_info()
    result["peak_rss_bytes"] = machine.peak_rss_bytes()
    result["breakdown"] = stats.breakdown(best["steps"], best["wall_seconds"])
    result["attention_seconds"] = sum(r.get("attention", 0.0) for r in best["steps"])
    if args.profile_ops:
        result["linear_seconds"] = sum(r.get("linears", 0.0) for r in best["steps"])
    result["tail"] = tail_summary(best["steps"], best["wall_seconds"])
    result["step_sizes"] = step_size_split(best["steps"], roofline.ModelCost.of(mc).linear_flops_per_token)
    busy = [r for r in best["steps"] if r["num_seqs"] >= 64]
    result["steps_with_64_plus_seqs"] = stats.breakdown(busy) if busy else None
    if not args.no_roofline:
        cost = roofline.ModelCost.of(mc)
        rate = args.gemm_gflops
        if rate is None:
            rate = machine.peak_gemm_gflops(mc, setup["dtype"])
        floor = roofline.throughput_floor(cost, requests, rate)
        result["roofline"] = {"gemm_gflops": rate, **floor,
                              "gap": roofline.gap(best["wall_seconds"], floor["floor_seconds"])}
    print(format_result(result))
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 0


def workload_lengths(args) -> dict:
    """Length overrides of the chosen workload kind, from the flags that apply to it."""
    if args.workload == "synthetic":
        return {"min_prompt": args.min_prompt_len, "max_prompt": args.max_prompt_len,
                "min_output": args.min_output_len, "max_output": args.max_output_len}
    if args.workload == "shared-prefix":
        return {"prefix_len": args.prefix_len, "max_output": args.max_output_len}
    if args.workload == "long-prompt":
        return {"prompt_len": args.max_prompt_len, "output_len": args.max_output_len}
    return {}


def _describe_sampling(sampling: dict | None) -> str:
    if not sampling or sampling.get("temperature", 0) == 0:
        return "greedy"
    return "sampled: " + ", ".join(f"{k} {v}" for k, v in sampling.items())


def format_result(r: dict) -> str:
    s, w = r["setup"], r["workload"]
    lines = [
        f"pagedcore bench throughput  ({s['dtype']}, {s['model']})",
        f"machine: {machine.describe_cpu(r['machine'])}",
        f"workload: {w['kind']}{' ' + w['file'] if w.get('file') else ''}: {w['num_requests']} requests, "
        f"{w['prompt_tokens']} prompt + {w['output_tokens']} output tokens; "
        f"{_describe_sampling(r.get('sampling'))}",
        f"start-up: {s['startup_seconds']:.2f} s   KV cache: {s['kv_cache']}",
        f"max_num_seqs {s['max_num_seqs']}, max_num_batched_tokens {s['max_num_batched_tokens']}, "
        f"prefix caching {'on' if s['enable_prefix_caching'] else 'off'}",
        "",
        f"Throughput: {r['requests_per_s']:.2f} requests/s, {r['output_tok_per_s']:.1f} output tok/s, "
        f"{r['total_tok_per_s']:.1f} total tok/s",
        f"wall: {r['wall_seconds']:.2f} s (runs: {', '.join(f'{x:.2f}' for x in r['all_walls'])})   "
        f"peak RSS: {r['peak_rss_bytes'] / 1024**3:.2f} GiB   peak KV use: {100 * r['peak_kv_cache_usage']:.1f} %   "
        f"prefix-hit tokens: {r['prefix_hit_tokens']}   preemptions: {r['num_preemptions']}",
        "",
        f"Per-step breakdown ({r['breakdown']['num_steps']} steps, share of wall):",
        stats.format_breakdown(r["breakdown"]),
        f"  attention kernels ({'layer loop and decoder stack' if 'linear_seconds' in r else 'layer-loop steps; the decoder stack with --profile-ops'}): "
        f"{r['attention_seconds']:.2f} s "
        f"({100 * r['attention_seconds'] / r['wall_seconds']:.1f} % of wall)",
    ]
    if "linear_seconds" in r:
        lines.append(f"  linears (layer loop and decoder stack): {r['linear_seconds']:.2f} s "
                     f"({100 * r['linear_seconds'] / r['wall_seconds']:.1f} % of wall)")
    if r.get("step_sizes"):
        lines.append("  by step size (tokens per step; layer GFLOP/s = the tokens' linear FLOPs over the "
                     "model-forward time):")
        for z in r["step_sizes"]:
            lines.append(f"    {z['label']:>8} tokens: {z['steps']:4d} steps {z['tokens']:6d} tokens "
                         f"{z['seconds']:7.2f} s ({z['forward_seconds']:6.2f} s forward, "
                         f"{z['lm_head_seconds']:5.2f} s lm_head)  layers at {z['layer_gflops']:5.1f} GFLOP/s")
    t = r["tail"]
    lines.append(f"  tail (<= {t['max_seqs']} sequences left): {t['steps']} steps, {t['seconds']:.2f} s "
                 f"({100 * t['share_of_wall']:.1f} % of wall) for {t['tokens']} tokens")
    busy = r.get("steps_with_64_plus_seqs")
    if busy:
        sched = busy["share"]["schedule"] + busy["share"]["input_prep"]
        lines.append(f"  steps with >= 64 sequences: scheduler + input prep {100 * sched:.1f} % of step time "
                     f"(target < 5 %)")
    if "roofline" in r:
        rf = r["roofline"]
        f = rf["flops"]
        lines += ["", f"Roofline: {f['total'] / 1e12:.2f} TFLOP (linears {f['linear'] / 1e12:.2f}, lm_head "
                      f"{f['lm_head'] / 1e12:.2f}, attention {f['attention'] / 1e12:.2f}) at {rf['gemm_gflops']:.0f} "
                      f"GFLOP/s (the best GEMM for {s['dtype']} math measured here) -> floor {rf['floor_seconds']:.1f} s; "
                      f"measured {r['wall_seconds']:.1f} s = {rf['gap']:.2f}x the floor"]
    return "\n".join(lines)
