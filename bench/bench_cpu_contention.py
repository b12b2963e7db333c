"""Decode throughput with and without another process busy on one core, per thread policy, side by side.

    .venv/bin/python bench/bench_cpu_contention.py --batch-sizes 1 16 --decode-steps 40 --rounds 3

Each (policy, quiet | contended) cell runs in a fresh subprocess (OpenMP reads its settings once, at
start), and the cells are alternated round by round (default quiet, adaptive quiet, default contended,
adaptive contended, then again), so a change in the machine's load hits every policy alike.
Contended = a `while True: pass` process pinned to core 0 for the whole cell.
Policies:
    default      the engine without the thread-team adaptation (PAGEDCORE_ADAPT_THREADS=0): torch's
                 thread count (all cores), OpenMP's default wait policy (spins)
    adaptive     the engine's default: engine/thread_team.py sizes the team to the cores other
                 processes leave free, re-checked every 0.5 s
    passive      OMP_WAIT_POLICY=PASSIVE, no adaptation: idle threads sleep instead of spinning
    one-thread   torch.set_num_threads(1), no adaptation: the floor a shrunk team reaches on 2 cores
A figure is tokens per second of the decode steps alone (prefill excluded), the median of --repeats
after --warmup-s seconds of decoding (the adaptation needs about a second to see the other process).
"others" is the cores' worth of CPU that other processes (the busy loop included) used meanwhile.
The machine this runs on may be shared: the 1-min load average is printed beside every figure; read
the ratios within one round, and re-measure quietly before changing a default.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

POLICIES = {
    "default": {"PAGEDCORE_ADAPT_THREADS": "0"},
    "adaptive": {"PAGEDCORE_ADAPT_THREADS": "1"},
    "passive": {"PAGEDCORE_ADAPT_THREADS": "0", "OMP_WAIT_POLICY": "PASSIVE"},
    "one-thread": {"PAGEDCORE_ADAPT_THREADS": "0", "PAGEDCORE_BENCH_THREADS": "1"},
}


def _decode_round(engine, tag: str, batch: int, steps: int) -> float:
    """Seconds for `steps` decode steps of `batch` sequences (after their prefill step)."""
    from pagedcore import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"{tag}-{i}", prompt_token_ids=[1000 + i, 2000, 3000, 4000], params=params)
    engine.step()                                   # the prefill
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    return time.perf_counter() - start


def measure(batch_sizes: list[int], decode_steps: int, repeats: int, warmup_s: float) -> dict:
    """Runs in the child: decode tok/s per batch size."""
    import torch

    from pagedcore import LLM
    from pagedcore.engine.thread_team import ThreadTeam

    if os.environ.get("PAGEDCORE_BENCH_THREADS"):
        torch.set_num_threads(int(os.environ["PAGEDCORE_BENCH_THREADS"]))
    llm = LLM(kv_cache_memory="512MiB", max_model_len=512, kv_cache_commit="startup")
    engine = llm.llm_engine
    out = {"start_threads": torch.get_num_threads()}
    n = 0
    deadline = time.perf_counter() + warmup_s
    while time.perf_counter() < deadline:           # warm-up: also lets the thread team settle
        _decode_round(engine, f"w{n}", max(batch_sizes), decode_steps)
        n += 1
    # An observer (it never resizes anything) measures what other processes ran over the whole measurement.
    observer = ThreadTeam(torch.get_num_threads(), set_threads=lambda n: None)
    for batch in batch_sizes:
        rates = [batch * decode_steps / _decode_round(engine, f"b{batch}-r{r}", batch, decode_steps)
                 for r in range(repeats)]
        out[str(batch)] = statistics.median(rates)
    observer._sample(time.monotonic())
    out["end_threads"] = torch.get_num_threads()
    out["other_cores"] = round(observer.other_cores, 2)
    return out


def run_cell(policy: str, contended: bool, args) -> dict:
    env = {**os.environ, **POLICIES[policy]}
    hog = None
    if contended:
        hog = subprocess.Popen([sys.executable, "-c", "import os; os.sched_setaffinity(0, {0})\nwhile True: pass"])
        time.sleep(1.0)
    try:
        cmd = [sys.executable, __file__, "--child", "--batch-sizes", *map(str, args.batch_sizes),
               "--decode-steps", str(args.decode_steps), "--repeats", str(args.repeats),
               "--warmup-s", str(args.warmup_s)]
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    cell = json.loads(result.stdout.strip().splitlines()[-1])
    cell["loadavg_1min"] = os.getloadavg()[0]
    return cell


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    p.add_argument("--decode-steps", type=int, default=40)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup-s", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=2, help="alternated rounds of every cell")
    p.add_argument("--policies", nargs="+", default=["default", "adaptive"], choices=list(POLICIES))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--output-json", default=None)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.batch_sizes, args.decode_steps, args.repeats, args.warmup_s)))
        return
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
    from pagedcore.benchmarks.machine import cpu_info, describe_cpu

    cpu = describe_cpu(cpu_info())
    print(f"decode tok/s on {cpu}; quiet vs one core busy; threads start->end; 1-min load average per cell")
    print("round policy      state      threads " + " ".join(f"{'b=' + str(b):>9}" for b in args.batch_sizes)
          + "  others  load")
    cells: dict[tuple[str, str], list[dict]] = {}
    for rnd in range(args.rounds):
        for state in ("quiet", "contended"):
            for policy in args.policies:
                cell = run_cell(policy, state == "contended", args)
                cells.setdefault((policy, state), []).append(cell)
                others = "-" if cell["other_cores"] is None else f"{cell['other_cores']:.2f}"
                print(f"{rnd:5d} {policy:11} {state:10} {cell['start_threads']:>2}->{cell['end_threads']:<2}   "
                      + " ".join(f"{cell[str(b)]:9.1f}" for b in args.batch_sizes)
                      + f"  {others:>6}  {cell['loadavg_1min']:.2f}", flush=True)
    print("\nmedians over rounds, and each policy against default in the same state:")
    summary = {}
    for policy in args.policies:
        for state in ("quiet", "contended"):
            med = {b: statistics.median(c[str(b)] for c in cells[(policy, state)]) for b in args.batch_sizes}
            base = {b: statistics.median(c[str(b)] for c in cells[("default", state)]) for b in args.batch_sizes} \
                if "default" in args.policies else med
            summary[f"{policy}/{state}"] = {str(b): med[b] for b in args.batch_sizes}
            print(f"  {policy:11} {state:10} " + " ".join(
                f"b={b}: {med[b]:7.1f} ({med[b] / base[b]:5.3f}x)" for b in args.batch_sizes))
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"cpu": cpu, "cells": {f"{k[0]}/{k[1]}": v for k, v in cells.items()}, "summary": summary},
                      f, indent=1)


if __name__ == "__main__":
    main()
