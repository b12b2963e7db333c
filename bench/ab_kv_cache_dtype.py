"""Single-stream requests through engines that differ only in --kv-cache-dtype, alternated in one process: the
default model, one engine per KV cache dtype, each round one request of `--context` random prompt tokens + 128
greedy tokens on every engine (order reversed every other round), whole-request seconds. The VM drifts by tens
of percent over minutes; alternating within one process makes every dtype see it.

    .venv/bin/python bench/ab_kv_cache_dtype.py --context 512 --rounds 6
    .venv/bin/python bench/ab_kv_cache_dtype.py --context 2048 --dtypes auto fp8_e4m3 fp8_e5m2

(Stop 36's fp8 vs bf16 single-stream figures, bench/RESULTS.md 2026-12-04 22:02, were taken with the scratch
script this replaces: the same engines and alternation.)
"""

from __future__ import annotations

import argparse
import random
import statistics
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtypes", nargs="+", default=["auto", "fp8_e4m3"],
                   help="KV cache dtypes, one engine each (auto: the model's activation dtype)")
    p.add_argument("--context", type=int, default=512, help="prompt tokens of each request")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--num-scheduler-steps", type=int, default=8)
    p.add_argument("--kv-cache-memory", default="2GiB")
    args = p.parse_args(argv)
    from pagedcore import LLM, SamplingParams

    engines = {kv: LLM(kv_cache_dtype=kv, kv_cache_memory=args.kv_cache_memory, enable_prefix_caching=False,
                       num_scheduler_steps=args.num_scheduler_steps, max_model_len=args.context + args.output_len + 16)
               for kv in args.dtypes}
    for llm in engines.values():
        llm.llm_engine.wait_for_kv_commit()
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    rng = random.Random(0)
    seconds = {kv: [] for kv in engines}
    for r in range(args.rounds):
        order = list(engines.items()) if r % 2 == 0 else list(engines.items())[::-1]
        for kv, llm in order:
            prompt = [rng.randrange(1000, 40000) for _ in range(args.context)]
            t0 = time.perf_counter()
            llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)
            seconds[kv].append(time.perf_counter() - t0)
    base = statistics.median(seconds[args.dtypes[0]])
    print(f"prompt {args.context} + {args.output_len} tokens, multi-step {args.num_scheduler_steps}, "
          f"{args.rounds} alternated rounds; whole-request seconds:")
    for kv, values in seconds.items():
        m = statistics.median(values)
        print(f"  {kv:10s} median {m:.4f} s  ({base / m:.3f}x the first's speed)  "
              + " ".join(f"{v:.3f}" for v in values))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
