"""In-process A/B of the one-call decode's threading (cpp/kernels/parallel.h DecodeThreading, switched with
_core.set_decode_threading between requests): one engine of the default model, single-stream requests of
64 random prompt tokens + 128 tokens, the modes taken in turn (order reversed every other round), each
request's decode time a token from its own timestamps. The VM drifts by tens of percent over minutes;
alternating within one process makes every mode see it.

    python bench/ab_decode_threading.py --modes inherit auto pool --rounds 12 --num-scheduler-steps 8
"""

from __future__ import annotations

import argparse
import random
import statistics


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", nargs="+", default=["inherit", "auto", "pool"],
                   choices=["inherit", "auto", "pool", "openmp"])
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--num-scheduler-steps", type=int, default=8)
    args = p.parse_args(argv)
    from pagedcore import LLM, SamplingParams, _core

    llm = LLM(kv_cache_memory="1GiB", enable_prefix_caching=False, num_scheduler_steps=args.num_scheduler_steps)
    llm.llm_engine.wait_for_kv_commit()
    params = SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True)
    rng = random.Random(0)
    saved = _core.decode_threading()
    ms = {mode: [] for mode in args.modes}
    try:
        for r in range(args.rounds):
            for mode in (args.modes if r % 2 == 0 else args.modes[::-1]):
                _core.set_decode_threading(mode)
                prompt = [rng.randrange(1000, 40000) for _ in range(64)]
                out = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0]
                m = out.metrics
                ms[mode].append((m.last_token_time - m.first_token_time) / (len(out.outputs[0].token_ids) - 1) * 1e3)
    finally:
        _core.set_decode_threading(saved)
    for mode, values in ms.items():
        print(f"--num-scheduler-steps {args.num_scheduler_steps} {mode:8s} median {statistics.median(values):.3f} "
              f"ms a token, min {min(values):.3f}, all {[round(v, 3) for v in values]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
