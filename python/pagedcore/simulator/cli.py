"""`pagedcore simulate`: policies compared on the real scheduler with a cost model; calibration of that model."""

from __future__ import annotations

import argparse
import json
import sys
import time


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    try:
        lo_i, hi_i = int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write MIN:MAX (or one number), e.g. 32:512") from None
    return lo_i, hi_i


def add_simulate_parser(subparsers) -> argparse.ArgumentParser:
    from pagedcore.simulator.simulation import DEFAULT_POLICIES

    p = subparsers.add_parser(
        "simulate", help="compare scheduling policies on the real scheduler, model-free",
        description="Drive the real C++ scheduler and block pool with fake tokens and a cost model for step time, "
                    "and compare policies side by side (static vs continuous batching, recompute vs swap, prefix "
                    "caching, chunked prefill, block size). No model is loaded.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    w = p.add_argument_group("workload")
    w.add_argument("--num-requests", type=int, default=1000)
    w.add_argument("--request-rate", type=float, default=0.0, help="requests/s, Poisson; 0 = all at once")
    w.add_argument("--prompt-len", type=_range, default=(32, 512), metavar="MIN:MAX",
                   help="tokens of each request's own prompt (after the shared prefix)")
    w.add_argument("--output-len", type=_range, default=(8, 256), metavar="MIN:MAX", help="tokens generated")
    w.add_argument("--shared-prefix-len", type=int, default=256, help="tokens of a system prompt requests share")
    w.add_argument("--num-prefix-groups", type=int, default=4, help="distinct system prompts")
    w.add_argument("--seed", type=int, default=0)
    e = p.add_argument_group("engine (SchedulerConfig names; each policy overrides some)")
    e.add_argument("--num-gpu-blocks", type=int, default=2048)
    e.add_argument("--block-size", type=int, default=16)
    e.add_argument("--max-num-seqs", type=int, default=128)
    e.add_argument("--max-num-batched-tokens", type=int, default=2048)
    e.add_argument("--max-model-len", type=int, default=None, help="default: the longest request of the workload")
    e.add_argument("--policies", default=",".join(DEFAULT_POLICIES),
                   help="comma-separated: continuous, static, swap, no-prefix-caching, no-chunked-prefill, block-size-N")
    o = p.add_argument_group("output")
    o.add_argument("--cost-model", default=None, metavar="FILE", help="a JSON cost model (default: the built-in one)")
    o.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    o.add_argument("--trace-file", default=None, help="write the first policy's step records here (JSONL), "
                   "replayable by the simulator page")
    o.add_argument("--trace-steps", type=int, default=5000, help="steps written to --trace-file")
    c = p.add_argument_group("calibration")
    c.add_argument("--calibrate", default=None, metavar="TRACE",
                   help="fit the cost model to a trace of the real engine (pagedcore serve --enable-trace "
                        "--trace-file TRACE) and print it as JSON")
    c.add_argument("--record-calibration", default=None, metavar="TRACE",
                   help="run the real engine on a calibration workload, write its trace here, fit and print the model")
    c.add_argument("--model", default=None, help="model for --record-calibration (default: the bundled one)")
    c.add_argument("--num-threads", type=int, default=None, help="threads for --record-calibration")
    p.set_defaults(func=cmd_simulate)
    return p


def cmd_simulate(args) -> int:
    from pagedcore.simulator.cost_model import DEFAULT_COST_MODEL, CostModel, fit_from_trace

    if args.record_calibration:
        from pagedcore.simulator.calibration import record_calibration

        print(record_calibration(args.record_calibration, model=args.model, num_threads=args.num_threads).to_json())
        return 0
    if args.calibrate:
        print(fit_from_trace(args.calibrate).to_json())
        return 0
    from pagedcore.simulator.simulation import SimConfig, policy_config, simulate
    from pagedcore.simulator.workload import WorkloadSpec, make_workload

    spec = WorkloadSpec(num_requests=args.num_requests, request_rate=args.request_rate,
                        min_prompt_len=args.prompt_len[0], max_prompt_len=args.prompt_len[1],
                        min_output_len=args.output_len[0], max_output_len=args.output_len[1],
                        shared_prefix_len=args.shared_prefix_len, num_prefix_groups=args.num_prefix_groups,
                        seed=args.seed)
    base = SimConfig(num_gpu_blocks=args.num_gpu_blocks, block_size=args.block_size, max_num_seqs=args.max_num_seqs,
                     max_num_batched_tokens=args.max_num_batched_tokens,
                     max_model_len=args.max_model_len or spec.max_request_len)
    cost = CostModel.load(args.cost_model) if args.cost_model else DEFAULT_COST_MODEL
    requests = make_workload(spec)
    names = [x.strip() for x in args.policies.split(",") if x.strip()]
    results = []
    t0 = time.perf_counter()
    for i, name in enumerate(names):
        trace_steps = args.trace_steps if args.trace_file and i == 0 else 0
        results.append(simulate(requests, policy_config(base, name), cost, policy=name, trace_steps=trace_steps))
    wall = time.perf_counter() - t0
    if args.trace_file:
        _write_trace(args.trace_file, results[0])
    if args.json:
        print(json.dumps({"workload": spec.to_dict(), "cost_model": json.loads(cost.to_json()),
                          "results": [{"policy": r.policy, "config": r.config, "metrics": r.metrics} for r in results]},
                         indent=2))
        return 0
    print(f"{spec.num_requests} requests (prompt {spec.shared_prefix_len} shared + {spec.min_prompt_len}..."
          f"{spec.max_prompt_len}, output {spec.min_output_len}...{spec.max_output_len} tokens), "
          f"{len(names)} policies simulated in {wall:.2f} s")
    print(f"cost model: {cost.describe()}")
    print(format_table(results))
    return 0


COLUMNS = (  # header, width, how to read it from a result's metrics
    ("policy", 19, lambda r, m: r.policy),
    ("out tok/s", 10, lambda r, m: f"{m['throughput_tokens_per_s']:.0f}"),
    ("req/s", 7, lambda r, m: f"{m['requests_per_s']:.2f}"),
    ("TTFT p50/p99 ms", 16, lambda r, m: _pair(m["ttft_ms"])),
    ("TPOT p50/p99 ms", 16, lambda r, m: _pair(m["tpot_ms"])),
    ("batch occ", 9, lambda r, m: f"{m['batch_occupancy']:.0%}"),
    ("KV use", 7, lambda r, m: f"{m['kv_usage']:.0%}"),
    ("KV waste", 8, lambda r, m: f"{m['kv_waste']:.1%}"),
    ("contig waste", 12, lambda r, m: f"{m['kv_waste_contiguous']:.0%}"),
    ("preempt", 7, lambda r, m: str(m["num_preemptions"])),
    ("prefill tok", 11, lambda r, m: str(m["num_prefill_tokens"])),
    ("prefix hit", 10, lambda r, m: f"{m['prefix_hit_rate']:.0%}"),
)


def _pair(p: dict) -> str:
    if p["p50"] is None:
        return "-"
    return f"{p['p50']:.0f}/{p['p99']:.0f}" if p["p99"] >= 100 else f"{p['p50']:.1f}/{p['p99']:.1f}"


def format_table(results) -> str:
    head = "  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w, _) in enumerate(COLUMNS))
    lines = [head, "-" * len(head)]
    for r in results:
        cells = [fn(r, r.metrics) for _, _, fn in COLUMNS]
        lines.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, (_, w, _)) in enumerate(zip(cells, COLUMNS))))
    lines.append("KV waste: allocated but unwritten slots (last-block tails); contig waste: what reserving "
                 "max_model_len per request without paging would leave unused.")
    return "\n".join(lines)


def _write_trace(path: str, result) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for record in result.records:
            f.write(json.dumps(record, separators=(",", ":")) + "\n")
    print(f"wrote {len(result.records) - 1} steps of policy {result.policy!r} to {path}", file=sys.stderr)
