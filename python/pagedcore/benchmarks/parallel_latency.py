"""`pagedcore bench latency --tensor-parallel-size N` (or --pipeline-parallel-size M): single-stream
decode of the parallel engine against the same model in one process.

Both engines are built from the same flags (one with tp = pp = 1) and run the same greedy request
alternately, --num-iters times each, so both see the same machine load; the figure is the median
decode rate (output tokens after the first / the time after the first). The per-step probes of
`bench latency` hook the in-process model, which a parallel engine does not have: this reports the
end-to-end rate only.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from pagedcore.benchmarks import machine
from pagedcore.benchmarks.engine_setup import build_engine, warm_up
from pagedcore.benchmarks.workloads import FIRST_PLAIN_TOKEN


def single_stream(engine, prompt: list[int], output_len: int) -> dict:
    """One greedy request alone in the engine: TTFT and the decode rate after the first token."""
    from pagedcore.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    times = []
    t0 = time.perf_counter()
    engine.add_request("parallel-latency", prompt_token_ids=prompt, params=params, output_kind="delta")
    while engine.has_unfinished_requests():
        for out in engine.step():
            times += [time.perf_counter()] * len(out.outputs[0].token_ids)
    return {"ttft": times[0] - t0, "decode_tok_per_s": (len(times) - 1) / (times[-1] - times[0])}


def cmd_parallel_latency(args) -> int:
    tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
    one, one_setup = build_engine(args, tensor_parallel_size=1, pipeline_parallel_size=1,
                                  distributed_executor_backend=None)
    par, par_setup = build_engine(args)
    try:
        vocab = one.view.model_config.vocab_size
        prompt = np.random.default_rng(args.seed_workload).integers(FIRST_PLAIN_TOKEN, vocab, args.input_len).tolist()
        warm_up(one, vocab)
        warm_up(par, vocab)
        runs = {"one process": [], f"tp {tp} x pp {pp}": []}
        for _ in range(max(1, args.num_iters)):
            for (label, acc), engine in zip(runs.items(), (one, par)):
                acc.append(single_stream(engine, prompt, args.output_len))
        load = machine_load()
    finally:
        par.shutdown()
    cpu = machine.describe_cpu(machine.cpu_info())
    print(f"pagedcore bench latency, parallel vs one process  ({par_setup['dtype']}, {par_setup['model']})")
    print(f"machine: {cpu}   1/5/15-min load average after the runs: {load}")
    print(f"single request, {args.input_len} prompt + {args.output_len} output tokens, greedy; median of "
          f"{max(1, args.num_iters)} alternating runs:")
    medians = {}
    for label, acc in runs.items():
        rate = statistics.median(r["decode_tok_per_s"] for r in acc)
        ttft = statistics.median(r["ttft"] for r in acc)
        medians[label] = rate
        print(f"  {label:<14} decode {rate:7.1f} tok/s   TTFT {1000 * ttft:7.1f} ms")
    one_rate, par_rate = medians.values()
    print(f"  ratio {par_rate / one_rate:.2f}x (start-up {one_setup['startup_seconds']:.1f} s vs "
          f"{par_setup['startup_seconds']:.1f} s)")
    return 0


def machine_load() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]
