"""Decode throughput with and without another process busy on one core, per thread policy, side by side.

    .venv/bin/python bench/bench_cpu_contention.py --batch-sizes 1 16 --decode-steps 40

Each (policy, quiet | contended) cell runs in a fresh subprocess, because OpenMP reads its settings
once, at start. Contended = a `while True: pass` process pinned to core 0 for the whole cell.
Policies:
    default      today's: torch's thread count (all cores), OpenMP's default wait policy (spins)
    passive      OMP_WAIT_POLICY=PASSIVE: idle threads sleep instead of spinning
    spin0        GOMP_SPINCOUNT=0 (libgomp's spelling of the same, the thread team is kept)
    free-cores   the thread team sized to the cores not busy (os.getloadavg / os.sched_getaffinity)
A figure is tokens per second of the decode steps alone (prefill excluded), the median of
--repeats. The machine this runs on is shared: print the 1-min load average beside every figure,
and do not change a default on numbers taken while other work runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

POLICIES = {
    "default": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin0": {"GOMP_SPINCOUNT": "0"},
    "free-cores": {"PAGEDCORE_BENCH_THREADS": "free"},
}


def _free_cores() -> int:
    """Cores this process may use minus the ones other processes keep busy (rounded load)."""
    cores = len(os.sched_getaffinity(0))
    busy = round(os.getloadavg()[0])
    return max(1, min(cores, cores - busy + 1))


def measure(batch_sizes: list[int], decode_steps: int, repeats: int) -> dict:
    """Runs in the child: decode tok/s per batch size."""
    import statistics

    import torch

    from pagedcore import LLM, SamplingParams

    threads = os.environ.get("PAGEDCORE_BENCH_THREADS")
    if threads == "free":
        torch.set_num_threads(_free_cores())
    llm = LLM(kv_cache_memory="512MiB", max_model_len=512)
    engine = llm.llm_engine
    out = {"num_threads": torch.get_num_threads()}
    for batch in batch_sizes:
        rates = []
        for r in range(repeats + 1):          # the first is a warm-up
            params = SamplingParams(temperature=0, max_tokens=decode_steps + 1, ignore_eos=True)
            for i in range(batch):
                engine.add_request(f"b{batch}-r{r}-{i}", prompt_token_ids=[1000 + i, 2000, 3000, 4000], params=params)
            engine.step()                     # the prefill
            start = time.perf_counter()
            while engine.has_unfinished_requests():   # decode_steps steps of `batch` tokens each
                engine.step()
            elapsed = time.perf_counter() - start
            if r:
                rates.append(batch * decode_steps / elapsed)
        out[str(batch)] = statistics.median(rates)
    return out


def run_cell(policy: str, contended: bool, args) -> dict:
    env = {**os.environ, **POLICIES[policy]}
    hog = None
    if contended:
        hog = subprocess.Popen([sys.executable, "-c", "import os; os.sched_setaffinity(0, {0})\nwhile True: pass"])
        time.sleep(1.0)
    try:
        cmd = [sys.executable, __file__, "--child", "--batch-sizes", *map(str, args.batch_sizes),
               "--decode-steps", str(args.decode_steps), "--repeats", str(args.repeats)]
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
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--output-json", default=None)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.batch_sizes, args.decode_steps, args.repeats)))
        return
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
    from pagedcore.benchmarks.machine import cpu_info, describe_cpu

    cpu = describe_cpu(cpu_info())
    print(f"decode tok/s on {cpu}; quiet vs one core busy (a shared machine: 1-min load average per cell)")
    header = "policy       threads " + " ".join(f"{'b=' + str(b) + ' quiet':>12} {'contended':>10} {'ratio':>6}"
                                               for b in args.batch_sizes) + "   load q/c"
    print(header)
    results = {}
    for policy in args.policies:
        quiet, busy = run_cell(policy, False, args), run_cell(policy, True, args)
        results[policy] = {"quiet": quiet, "contended": busy}
        cells = " ".join(f"{quiet[str(b)]:12.1f} {busy[str(b)]:10.1f} {busy[str(b)] / quiet[str(b)]:6.2f}"
                         for b in args.batch_sizes)
        print(f"{policy:12} {quiet['num_threads']:>2}/{busy['num_threads']:<2}  {cells}   "
              f"{quiet['loadavg_1min']:.2f}/{busy['loadavg_1min']:.2f}", flush=True)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"cpu": cpu, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
