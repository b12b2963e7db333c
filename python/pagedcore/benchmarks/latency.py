"""`pagedcore bench latency`: one request's TTFT and TPOT, and the decode step at fixed batch sizes.

Part 1 runs a single request (prompt --input-len, output --output-len, greedy, ignore_eos) --num-iters
times and reports time to first token, time per output token and where its steps' time goes.
Part 2 holds --batch-sizes sequences in decode (prompts of --input-len tokens) and times
--decode-steps steps each: step time, tokens/s and the share spent outside the model forward.
"""

from __future__ import annotations

import json
import statistics
import time

import numpy as np

from pagedcore.benchmarks import machine, roofline, stats
from pagedcore.benchmarks.engine_setup import build_engine, warm_up
from pagedcore.benchmarks.probe import StepProbe
from pagedcore.benchmarks.workloads import FIRST_PLAIN_TOKEN


def _prompt(rng, length: int, vocab_size: int) -> list[int]:
    return rng.integers(FIRST_PLAIN_TOKEN, vocab_size, length).tolist()


def single_request(engine, prompt: list[int], output_len: int) -> dict:
    """One request alone in the engine: TTFT (add to first token), TPOT, E2E and its step records."""
    from pagedcore.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    token_times = []
    with StepProbe(engine) as probe:
        t0 = time.perf_counter()
        engine.add_request("latency", prompt_token_ids=prompt, params=params, output_kind="delta")
        while engine.has_unfinished_requests():
            for out in engine.step():
                now = time.perf_counter()
                token_times += [now] * len(out.outputs[0].token_ids)
        records = probe.take()
    e2e = token_times[-1] - t0
    ttft = token_times[0] - t0
    tpot = (token_times[-1] - token_times[0]) / (len(token_times) - 1) if len(token_times) > 1 else float("nan")
    return {"ttft": ttft, "tpot": tpot, "e2e": e2e, "num_tokens": len(token_times), "steps": records}


def decode_steps(engine, batch_size: int, input_len: int, num_steps: int, rng) -> dict:
    """batch_size sequences in decode together; times num_steps pure-decode steps (after the prefill)."""
    from pagedcore.sampling_params import SamplingParams

    vocab = engine.view.model_config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=num_steps + 8, ignore_eos=True)
    ids = [f"decode-{batch_size}-{i}" for i in range(batch_size)]
    for rid in ids:
        engine.add_request(rid, prompt_token_ids=_prompt(rng, input_len, vocab), params=params, output_kind="final")
    with StepProbe(engine) as probe:
        while True:                            # prefill (maybe chunked) until the next step is all decode
            engine.step()
            last = probe.records[-1]
            if last["num_prefill_tokens"] == 0 and last["num_seqs"] == batch_size:
                break
        probe.take()
        gaps = []
        t_prev = time.perf_counter()
        for _ in range(num_steps):
            engine.step()
            now = time.perf_counter()
            gaps.append(now - t_prev)
            t_prev = now
        records = [r for r in probe.take() if r["num_decode_tokens"] == batch_size]
    for rid in ids:
        engine.abort_request(rid)
    step = statistics.median(r["total"] for r in records)
    b = stats.breakdown(records)
    return {"batch_size": batch_size, "steps": len(records), "median_step_seconds": step,
            "median_gap_seconds": statistics.median(gaps), "tok_per_s": batch_size / step,
            "model_forward_share": (b["seconds"]["model_forward"] + b["seconds"]["lm_head"]) / b["step_seconds"],
            "outside_forward_share": b["outside_forward_share"], "breakdown": b,
            "attention_share": sum(r["attention"] for r in records) / b["step_seconds"]}



def grounded_decode(engine, requests) -> dict:
    """Single-stream decode tok/s over input-grounded requests (bench/workloads/input_grounded.json),
    with speculation off and on in the same engine (the speculator unplugged for "off"), request by
    request alternately so that both see the same machine load; greedy, so both emit the same tokens."""
    from pagedcore.spec_decode import SpecDecodeStats

    speculator = engine.speculator
    modes = [("off", None)] + ([("on", speculator)] if speculator is not None else [])
    acc = {label: {"decode_seconds": 0.0, "decode_tokens": 0, "ttft": []} for label, _ in modes}
    if speculator is not None:
        speculator.stats = SpecDecodeStats(speculator.config.num_speculative_tokens)
    try:
        for r in requests:
            for label, spec in modes:
                engine.speculator = spec
                one = single_request(engine, r.prompt_token_ids, r.max_tokens)
                acc[label]["decode_seconds"] += one["e2e"] - one["ttft"]
                acc[label]["decode_tokens"] += one["num_tokens"] - 1
                acc[label]["ttft"].append(one["ttft"])
    finally:
        engine.speculator = speculator
    out = {label: {"decode_tok_per_s": a["decode_tokens"] / a["decode_seconds"], "decode_tokens": a["decode_tokens"],
                   "median_ttft": statistics.median(a["ttft"])} for label, a in acc.items()}
    if speculator is not None:
        out["speedup"] = out["on"]["decode_tok_per_s"] / out["off"]["decode_tok_per_s"]
        out["speculative_config"] = vars(speculator.config)
        out["acceptance"] = speculator.stats.as_dict()
    out["num_requests"] = len(requests)
    return out


def cmd_latency(args) -> int:
    if getattr(args, "tensor_parallel_size", 1) * getattr(args, "pipeline_parallel_size", 1) > 1:
        from pagedcore.benchmarks.parallel_latency import cmd_parallel_latency   # against one process

        return cmd_parallel_latency(args)
    engine, setup = build_engine(args)
    mc = engine.view.model_config
    rng = np.random.default_rng(args.seed_workload)
    warm_up(engine, mc.vocab_size)
    if getattr(args, "workload_file", None):
        from pagedcore.benchmarks.workloads import from_file

        grounded = grounded_decode(engine, from_file(args.workload_file, args.num_prompts))
        result = {"setup": setup, "machine": machine.cpu_info(), "load_average": machine_load(),
                  "workload_file": args.workload_file, "grounded": grounded}
        print(format_grounded(result))
        if args.output_json:
            with open(args.output_json, "w") as f:
                json.dump(result, f, indent=1, default=str)
        return 0
    prompt = _prompt(rng, args.input_len, mc.vocab_size)
    runs = [single_request(engine, prompt, args.output_len) for _ in range(max(1, args.num_iters))]
    runs.sort(key=lambda r: r["e2e"])
    mid = runs[len(runs) // 2]
    single = {k: statistics.median(r[k] for r in runs) for k in ("ttft", "tpot", "e2e")}
    single["breakdown"] = stats.breakdown(mid["steps"])
    decode = [decode_steps(engine, b, args.input_len, args.decode_steps, rng) for b in args.batch_sizes]
    bw = args.bandwidth_gbps or machine.measure_bandwidth(min_time=0.3)["copy_gbps"]
    rate = args.gemm_gflops or machine.peak_gemm_gflops(mc, setup["dtype"])
    cost = roofline.ModelCost.of(mc)
    kv_bytes = 2 if setup["dtype"] == "bfloat16" else 4
    # Weight bytes per parameter as held (a quantized model's blocks: ~0.9 for the Q4_1 default model).
    resident = sum(setup.get("weight_bytes", {}).values())
    bytes_per = resident / cost.decode_weight_bytes(1) if resident else kv_bytes
    setup["weight_bytes_per_param"] = round(bytes_per, 3)
    for d in decode:
        floor = roofline.decode_step_floor_seconds(cost, bytes_per, bw, rate, d["batch_size"],
                                                   args.input_len + args.decode_steps // 2, kv_bytes)
        d["floor_tok_per_s"] = d["batch_size"] / floor
        d["gap"] = roofline.gap(d["median_step_seconds"], floor)
    one_floor = roofline.decode_step_floor_seconds(cost, bytes_per, bw, rate, 1, args.input_len + args.output_len // 2,
                                                   kv_bytes)
    single["floor_tpot"] = one_floor
    result = {"setup": setup, "machine": machine.cpu_info(), "input_len": args.input_len,
              "output_len": args.output_len, "single_request": single, "decode": decode, "bandwidth_gbps": bw,
              "gemm_gflops": rate, "peak_rss_bytes": machine.peak_rss_bytes()}
    print(format_result(result))
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 0


def format_result(r: dict) -> str:
    s, one = r["setup"], r["single_request"]
    lines = [
        f"pagedcore bench latency  ({s['dtype']}, {s['model']})",
        f"machine: {machine.describe_cpu(r['machine'])}",
        f"start-up: {s['startup_seconds']:.2f} s",
        "",
        f"One request, {r['input_len']} prompt + {r['output_len']} output tokens (median of runs):",
        f"  TTFT {1000 * one['ttft']:.1f} ms   TPOT {1000 * one['tpot']:.2f} ms ({1 / one['tpot']:.1f} tok/s)   "
        f"E2E {one['e2e']:.2f} s;  TPOT floor {1000 * one['floor_tpot']:.2f} ms "
        f"({1 / one['floor_tpot']:.1f} tok/s), measured = {one['tpot'] / one['floor_tpot']:.2f}x the floor",
        "  per-step breakdown (share of step time):",
        stats.format_breakdown(one["breakdown"], indent="    "),
        "",
        f"Decode step (prompts of {r['input_len']} tokens; floor = max(weights + KV over {r['bandwidth_gbps']:.1f} GB/s, "
        f"FLOPs over {r['gemm_gflops']:.0f} GFLOP/s)):",
        f"  {'batch':>5} {'step ms':>8} {'tok/s':>8} {'floor tok/s':>11} {'x floor':>7} {'model fwd':>9} "
        f"{'attention':>9} {'outside fwd':>11} {'sched+prep':>10}",
    ]
    for d in r["decode"]:
        sh = d["breakdown"]["share"]
        lines.append(f"  {d['batch_size']:>5} {1000 * d['median_step_seconds']:>8.2f} {d['tok_per_s']:>8.1f} "
                     f"{d['floor_tok_per_s']:>11.1f} {d['gap']:>7.2f} {100 * d['model_forward_share']:>8.1f}% "
                     f"{100 * d['attention_share']:>8.1f}% {100 * d['outside_forward_share']:>10.1f}% "
                     f"{100 * (sh['schedule'] + sh['input_prep']):>9.1f}%")
    return "\n".join(lines)


def machine_load() -> list[float]:
    """1, 5 and 15-minute load averages (the machine may be shared: print them beside every figure)."""
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return []


def format_grounded(r: dict) -> str:
    s, g = r["setup"], r["grounded"]
    lines = [f"pagedcore bench latency --workload-file {r['workload_file']}  ({s['dtype']}, {s['model']})",
             f"machine: {machine.describe_cpu(r['machine'])}   load average: {r['load_average']}",
             f"single-stream decode over {g['num_requests']} input-grounded requests (speculation off / on alternately):"]
    for label in ("off", "on"):
        if label in g:
            lines.append(f"  speculation {label:<3}  {g[label]['decode_tok_per_s']:8.1f} tok/s decode   "
                         f"({g[label]['decode_tokens']} tokens, median TTFT {1000 * g[label]['median_ttft']:.1f} ms)")
    if "speedup" in g:
        a = g["acceptance"]
        lines.append(f"  speed-up {g['speedup']:.2f}x   acceptance {100 * a['acceptance_rate']:.1f}% of "
                     f"{a['num_draft_tokens']} drafts, {a['mean_accepted_length']:.2f} tokens per verification, "
                     f"accepted per position {a['num_accepted_tokens_per_pos']}")
    return "\n".join(lines)
