"""Sampler time per step over a 49152-token vocabulary (SmolLM2's), greedy vs. mixed params.

    python bench/bench_sampler.py [--rows 1 64 256] [--iters 20] [--threads N]

Logits are LM-like (a Zipf-shaped distribution, probability ~ rank^-1.5, shuffled per row) so
top-p nuclei have realistic sizes. Reports sample time as median / best of --iters calls (best is
what survives a shared, busy machine), and the metadata build apart, since an engine can keep
most of it across steps.
"""

import argparse
import statistics
import time

import torch

from pagedcore.sampling.sampler import Sampler
from pagedcore.sampling import SamplingMetadata, make_generator
from pagedcore.sampling_params import SamplingParams

VOCAB = 49152

SCENARIOS = {
    "greedy": [SamplingParams(temperature=0)],
    "temperature only": [SamplingParams(temperature=0.8)],
    "top-p 0.95": [SamplingParams(temperature=0.7, top_p=0.95)],
    "top-k 50": [SamplingParams(temperature=0.7, top_k=50)],
    "mixed": [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.7, top_p=0.95),
        SamplingParams(temperature=1.0, top_k=40, seed=1),
        SamplingParams(temperature=0.8, top_p=0.9, repetition_penalty=1.1, frequency_penalty=0.2),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.6, min_p=0.05, logprobs=5, seed=2),
    ],
}


def lm_like_logits(num_rows: int) -> torch.Tensor:
    ranks = torch.arange(1, VOCAB + 1, dtype=torch.float32)
    base = -1.5 * torch.log(ranks)  # [V] log of rank^-1.5
    rows = [base[torch.randperm(VOCAB)] for _ in range(num_rows)]
    return torch.stack(rows) + 0.1 * torch.randn(num_rows, VOCAB)  # [R, V]


def bench(num_rows: int, pattern: list[SamplingParams], iters: int) -> tuple[float, float, float]:
    params = [pattern[i % len(pattern)] for i in range(num_rows)]
    generators = [make_generator(p) for p in params]
    prompts = [list(range(i, i + 200)) for i in range(num_rows)]
    outputs = [list(range(i, i + 50)) for i in range(num_rows)]
    source = lm_like_logits(num_rows)
    logits = torch.empty_like(source)
    sampler = Sampler()
    build_ms, sample_ms = [], []
    for i in range(iters + 2):
        t0 = time.perf_counter()
        md = SamplingMetadata.from_requests(params, vocab_size=VOCAB, eos_token_ids=[2], generators=generators,
                                            prompt_token_ids=prompts, output_token_ids=outputs)
        t1 = time.perf_counter()
        logits.copy_(source)
        t2 = time.perf_counter()
        sampler(logits, md)
        t3 = time.perf_counter()
        if i >= 2:  # warm-up
            build_ms.append((t1 - t0) * 1e3)
            sample_ms.append((t3 - t2) * 1e3)
    return statistics.median(build_ms), statistics.median(sample_ms), min(sample_ms)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"vocab {VOCAB}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
          "ms per step: sample median / best (metadata build median)")
    print(f"{'scenario':<18}" + "".join(f"{f'{r} rows':>26}" for r in args.rows))
    for name, pattern in SCENARIOS.items():
        cells = []
        for num_rows in args.rows:
            build, sample, best = bench(num_rows, pattern, args.iters)
            cells.append(f"{sample:.2f} / {best:.2f} ({build:.2f})")
        print(f"{name:<18}" + "".join(f"{c:>26}" for c in cells))


if __name__ == "__main__":
    main()
