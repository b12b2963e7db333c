"""A/B of a setting read once per process (PAGEDCORE_KERNEL_THREADING, OMP_* variables, anything a build
reads at start-up): fresh processes alternated A B, B A, A B, ..., each decoding single-stream requests of
the default model (64 random prompt tokens + 128 greedy tokens, multi-step 8 by default) for --seconds, and
printing its median time a token; then the pairwise ratios B / A. The VM's speed drifts by tens of percent over
minutes: only ratios within a pair mean much, and only over several pairs.

    .venv/bin/python bench/ab_processes.py PAGEDCORE_KERNEL_THREADING=openmp PAGEDCORE_KERNEL_THREADING=pool
    .venv/bin/python bench/ab_processes.py "" OMP_WAIT_POLICY=passive --pairs 8 --format q4_0

An arm is a space-separated list of VAR=value ("" for none). --format takes bench/bench_decode.py's names
(auto = the GGUF as stored, q4_0 / q8_0 re-quantized at load, bfloat16, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys


def child(fmt: str, seconds: float, steps: int) -> None:
    import time

    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from decode_engine import _engine, _one_request, load_format

    loaded = load_format(fmt)
    engine = _engine(loaded, steps)
    g = torch.Generator().manual_seed(1)
    _one_request(engine, loaded, g, "warm", 64, 128)
    per_token = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        decode, _ = _one_request(engine, loaded, g, f"r{len(per_token)}", 64, 128)
        per_token.append(sum(decode) / 127)  # the decode steps' seconds over the tokens after the first
    from pagedcore import _core

    print(json.dumps({"ms": statistics.median(per_token) * 1e3, "requests": len(per_token),
                      "threading": _core.kernel_threading()}))


def run_arm(arm: str, args) -> dict:
    env = dict(os.environ)
    for item in arm.split():
        name, _, value = item.partition("=")
        env[name] = value
    out = subprocess.run([sys.executable, __file__, "--child", "--format", args.format, "--seconds", str(args.seconds),
                          "--num-scheduler-steps", str(args.num_scheduler_steps)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("arms", nargs="*", help="A and B: each a space-separated list of VAR=value")
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--format", default="auto")
    p.add_argument("--seconds", type=float, default=4.0, help="decoding time per process")
    p.add_argument("--num-scheduler-steps", type=int, default=8)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.format, args.seconds, args.num_scheduler_steps)
        return 0
    if len(args.arms) != 2:
        p.error("give two arms, A and B")
    a, b = args.arms
    results = {a: [], b: []}
    for pair in range(args.pairs):
        for arm in ((a, b) if pair % 2 == 0 else (b, a)):
            r = run_arm(arm, args)
            results[arm].append(r["ms"])
            print(f"pair {pair} [{arm or 'no change'}]: {r['ms']:.3f} ms a token ({r['requests']} requests, "
                  f"kernels on {r['threading']})", flush=True)
    ratios = [rb / ra for ra, rb in zip(results[a], results[b])]
    print(f"A [{a or 'no change'}] median {statistics.median(results[a]):.3f} ms; "
          f"B [{b or 'no change'}] median {statistics.median(results[b]):.3f} ms; "
          f"B / A per pair {', '.join(f'{r:.3f}' for r in ratios)}: median {statistics.median(ratios):.3f}, "
          f"B faster in {sum(r < 1 for r in ratios)} of {len(ratios)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
