"""The CPU KV cache's two layouts side by side in one process (engine/kv_cache.py): layer-major
([layers, 2, blocks, ...] in memory, a GPU cache's layout) against block-major (the CPU default, every
layer's K and V of a block together). Two engines of the default model, one per layout, requests
alternated between them (this VM drifts by 10% within minutes).

    bench/bench_kv_layout.py single --context 1536 [--scatter]   # single-stream, 128 tokens a request
    bench/bench_kv_layout.py workload [--scatter]                # the fixed 128-request workload

--scatter first shuffles each engine's free block list (allocate every block, release in random order),
as hours of serving with prefix caching leave it: a sequence's blocks then lie anywhere in the cache
instead of in ascending order, which is where the layouts differ (a fresh engine hands out ascending ids).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

LAYOUTS = ("layer_major", "block_major")
WORKLOAD = Path(__file__).parent / "workloads" / "workload_n128_seed0.json"


def make_engines(scatter: bool, num_scheduler_steps: int):
    from pagedcore import LLM

    engines = {}
    for layout in LAYOUTS:
        os.environ["PAGEDCORE_KV_LAYOUT"] = layout
        llm = LLM(kv_cache_memory="4GiB", enable_prefix_caching=False, num_scheduler_steps=num_scheduler_steps)
        llm.llm_engine.wait_for_kv_commit()
        if scatter:
            pool = llm.llm_engine.scheduler.gpu_pool
            ids = [pool.allocate() for _ in range(len(pool.free_block_ids()))]
            random.Random(1).shuffle(ids)
            for block in ids:
                pool.release(block)
        engines[layout] = llm
    os.environ.pop("PAGEDCORE_KV_LAYOUT")
    return engines


def run(engines, rounds: int, one_round) -> dict[str, list[float]]:
    """one_round(llm) -> a figure; layouts alternate, the first one swapping each round."""
    figures = {layout: [] for layout in LAYOUTS}
    for r in range(rounds):
        for layout in (LAYOUTS if r % 2 == 0 else LAYOUTS[::-1]):
            figures[layout].append(one_round(engines[layout]))
    return figures


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["single", "workload"])
    p.add_argument("--context", type=int, default=512, help="single: prompt tokens (random ids)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--scatter", action="store_true")
    p.add_argument("--num-scheduler-steps", type=int, default=1, help="the engines' multi-step scheduling")
    args = p.parse_args(argv)
    from pagedcore import SamplingParams

    engines = make_engines(args.scatter, args.num_scheduler_steps)
    rng = random.Random(0)
    if args.mode == "single":
        params = SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True)

        def one_round(llm):
            prompt = [rng.randrange(1000, 40000) for _ in range(args.context)]
            t0 = time.perf_counter()
            llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)
            return time.perf_counter() - t0
        unit, better = "s a request (prompt + 128 tokens)", min
    else:
        requests = json.loads(WORKLOAD.read_text())["requests"]
        prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in requests]
        params = [SamplingParams(max_tokens=r["max_tokens"], temperature=0.0, ignore_eos=True) for r in requests]
        total = sum(r["max_tokens"] for r in requests)

        def one_round(llm):
            t0 = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            return total / (time.perf_counter() - t0)
        unit, better = "output tok/s", max
    figures = run(engines, args.rounds, one_round)
    print(f"{args.mode}{' --context %d' % args.context if args.mode == 'single' else ''}"
          f"{' --scatter' if args.scatter else ''} --num-scheduler-steps {args.num_scheduler_steps}: {unit}, "
          f"{args.rounds} alternated rounds")
    for layout, values in figures.items():
        print(f"  {layout:12s} median {statistics.median(values):.4g}  best {better(values):.4g}  "
              f"all {[round(v, 4) for v in values]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
