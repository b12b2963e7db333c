"""In-process A/B of an environment switch the engine reads per step or per call (PAGEDCORE_GREEDY_DECODE,
PAGEDCORE_CPU_SAMPLER, ...): one engine, single-stream requests of --tokens tokens alternating the two
values (A B, B A, A B, ...), the median TPOT of each request, and the pairwise ratios B / A. The VM's
speed drifts by tens of percent over minutes; alternating within one process makes both arms see it.

    python bench/ab_env.py PAGEDCORE_CPU_SAMPLER --pairs 8 --dtype auto --temperature 0.8 --top-p 0.95
    python bench/ab_env.py PAGEDCORE_FUSED_LOGIT_EDITS --pairs 8 --repetition-penalty 1.1 --frequency-penalty 0.3
    python bench/ab_env.py PAGEDCORE_GREEDY_DECODE --pairs 8 --logprobs 5
    python bench/ab_env.py PAGEDCORE_CPU_LOGPROBS --pairs 4 --prompt-len 512 --tokens 1 --prompt-logprobs 5 \
        --whole-request

Prompts are random token ids (seeded): flat next-token distributions, the worst case for top-p.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from pagedcore.config import EngineConfig
from pagedcore.engine.llm_engine import LLMEngine
from pagedcore.loader import load_model
from pagedcore.sampling_params import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variable", help="the environment variable to switch")
    parser.add_argument("--values", nargs=2, default=["0", "1"], metavar=("A", "B"), help="its two values")
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--dtype", default="auto", help="auto (a GGUF as stored), bfloat16, float32")
    parser.add_argument("--tokens", type=int, default=128, help="output tokens a request")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--repetition-penalty", type=float, default=1.0)
    parser.add_argument("--presence-penalty", type=float, default=0.0)
    parser.add_argument("--frequency-penalty", type=float, default=0.0)
    parser.add_argument("--logprobs", type=int, default=None, help="top logprobs a token (default: none)")
    parser.add_argument("--prompt-logprobs", type=int, default=None, help="top logprobs a prompt position")
    parser.add_argument("--whole-request", action="store_true",
                        help="time each whole request (prefill included) instead of its median TPOT")
    args = parser.parse_args()

    loaded = load_model(dtype=args.dtype, load_tokenizer=False)
    engine = LLMEngine(EngineConfig(dtype=loaded.config.dtype, max_model_len=2048, kv_cache_memory="512MiB",
                                    kv_cache_commit="startup"), loaded=loaded)
    params = SamplingParams(max_tokens=args.tokens, ignore_eos=True, temperature=args.temperature,
                            top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
                            repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
                            frequency_penalty=args.frequency_penalty, logprobs=args.logprobs,
                            prompt_logprobs=args.prompt_logprobs)
    prompts = torch.Generator().manual_seed(1)

    def tpot_ms(request_id: str) -> float:
        prompt = torch.randint(100, loaded.config.vocab_size, (args.prompt_len,), generator=prompts).tolist()
        engine.add_request(request_id, prompt_token_ids=prompt, params=params, output_kind="delta")
        stamps = [time.perf_counter()]
        while engine.has_unfinished_requests():
            engine.step()
            stamps.append(time.perf_counter())
        if args.whole_request:
            return (stamps[-1] - stamps[0]) * 1e3
        return statistics.median(b - a for a, b in zip(stamps[1:], stamps[2:])) * 1e3

    tpot_ms("warm-up")
    a, b = args.values
    times: dict[str, list[float]] = {a: [], b: []}
    for i in range(args.pairs):
        for value in ((a, b) if i % 2 == 0 else (b, a)):
            os.environ[args.variable] = value
            times[value].append(tpot_ms(f"{i}-{value}"))
    ratios = [y / x for x, y in zip(times[a], times[b])]
    print(f"{args.dtype}, {params.temperature=}, {params.top_p=}, {params.top_k=}, {params.min_p=}, "
          f"{params.repetition_penalty=}, {params.presence_penalty=}, {params.frequency_penalty=}, {params.logprobs=}, "
          f"{params.prompt_logprobs=}")
    for value in (a, b):
        what = "request" if args.whole_request else "TPOT"
        print(f"{args.variable}={value} median {what} ms: {statistics.median(times[value]):.3f}  "
              f"({' '.join(f'{t:.2f}' for t in times[value])})")
    print(f"pairwise ratio {b}/{a}: median {statistics.median(ratios):.3f}  ({' '.join(f'{r:.3f}' for r in ratios)})")


if __name__ == "__main__":
    main()
