"""Single-stream A/B of multi-step scheduling (--num-scheduler-steps): two engines in one process, one
with N steps and one without, alternated (A B, B A, ...) over greedy requests (or sampled ones, seeded so
that both arms draw the same tokens: --temperature, --top-p); each request's time per
output token as (t(128 tokens) - t(1 token)) / 127, the median of each arm, and whether both gave the
same tokens. The VM's speed drifts by tens of percent over minutes: alternating makes both arms see it.

    .venv/bin/python bench/ab_multi_step.py --steps 8 --rounds 16                # Q4_1 as stored
    .venv/bin/python bench/ab_multi_step.py --steps 8 --rounds 16 --dtype bfloat16
    .venv/bin/python bench/ab_multi_step.py --steps 8 --rounds 16 --temperature 0.8 --top-p 0.95
    .venv/bin/python bench/ab_multi_step.py --steps 8 --rounds 16 --repetition-penalty 1.1 --frequency-penalty 0.3
    .venv/bin/python bench/ab_multi_step.py --steps 8 --rounds 16 --logprobs 5
"""

from __future__ import annotations

import argparse
import statistics
import time

from pagedcore import LLM, SamplingParams


def tpot_ms(llm: LLM, prompt: dict, tokens: int, **sampling) -> tuple[float, list[int]]:
    """(ms per output token after the first, the tokens) of one request (greedy unless sampling says)."""
    t0 = time.perf_counter()
    llm.generate([prompt], SamplingParams(max_tokens=1, ignore_eos=True, **sampling), use_tqdm=False)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = llm.generate([prompt], SamplingParams(max_tokens=tokens, ignore_eos=True, **sampling), use_tqdm=False)
    whole = time.perf_counter() - t0
    return (whole - first) / (tokens - 1) * 1e3, out[0].outputs[0].token_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8, help="num_scheduler_steps of the B arm (A: 1)")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--tokens", type=int, default=128, help="output tokens a request")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--repetition-penalty", type=float, default=1.0)
    parser.add_argument("--frequency-penalty", type=float, default=0.0)
    parser.add_argument("--logprobs", type=int, default=None)
    args = parser.parse_args()
    sampling = dict(temperature=args.temperature, top_p=args.top_p, seed=0 if args.temperature > 0 else None,
                    repetition_penalty=args.repetition_penalty, frequency_penalty=args.frequency_penalty,
                    logprobs=args.logprobs)
    common = dict(dtype=args.dtype, kv_cache_memory="256MiB", max_model_len=2048, kv_cache_commit="startup")
    engines = {1: LLM(**common), args.steps: LLM(num_scheduler_steps=args.steps, **common)}
    prompt = {"prompt_token_ids": [1] + list(range(100, 100 + args.prompt_len - 1))}
    for llm in engines.values():
        tpot_ms(llm, prompt, 9, **sampling)               # warm-up
    times: dict[int, list[float]] = {k: [] for k in engines}
    tokens: dict[int, list[int]] = {}
    for r in range(args.rounds):
        for k in (list(engines) if r % 2 == 0 else list(engines)[::-1]):
            t, tokens[k] = tpot_ms(engines[k], prompt, args.tokens + 1, **sampling)
            times[k].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"num_scheduler_steps={k}: median TPOT {med[k]:.3f} ms  ({' '.join(f'{x:.2f}' for x in v)})")
    print(f"ratio {args.steps}/1: {med[args.steps] / med[1]:.3f}; same tokens: {tokens[1] == tokens[args.steps]}")


if __name__ == "__main__":
    main()
