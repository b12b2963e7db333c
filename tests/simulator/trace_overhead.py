"""What tracing costs per scheduler step: `python -m tests.simulator.trace_overhead`.

The same request stream (fake tokens, no model) is driven through the C++ scheduler four ways:
tracing off; on with the events dropped (the C++ cost); on with the StepTracer building a record
(the Python cost on the engine thread); and the TraceRecorder on top, writing JSONL (what
`pagedcore serve --enable-trace --trace-file F` pays). Each is run `repeats` times; the best is kept.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from pagedcore import _core
from pagedcore.simulator.recorder import TraceRecorder
from pagedcore.simulator.trace import StepTracer


def _drive(num_requests: int, num_seqs: int, mode: str, seed: int = 0) -> tuple[float, int]:
    s = _core.Scheduler(_core.SchedulerConfig(
        num_gpu_blocks=2048, block_size=16, max_num_batched_tokens=2048, max_num_seqs=num_seqs,
        max_model_len=2048, enable_trace=mode != "off"))
    rng = np.random.default_rng(seed)
    system = rng.integers(10, 30_000, 256)
    for i in range(num_requests):
        prompt = np.concatenate([system, rng.integers(10, 30_000, int(rng.integers(16, 512)))])
        s.add_sequence(i, prompt, max_tokens=int(rng.integers(8, 256)), ignore_eos=True)
    tracer = StepTracer(s) if mode in ("tracer", "recorder") else None
    recorder, path = None, None
    if mode == "recorder":
        fd, path = tempfile.mkstemp(suffix=".jsonl")
        os.close(fd)
        recorder = TraceRecorder(trace_file=path)
        recorder.start(tracer)
    timing = {"schedule": 0.0, "forward": 0.0, "sample": 0.0, "total": 0.0}
    steps = 0
    t0 = time.perf_counter()
    while s.has_unfinished():
        out = s.schedule()
        res = s.update(np.full(len(out.sample_seq_ids), 7, dtype=np.int64))
        if recorder is not None:
            recorder.on_step(out, res, timing)
        elif tracer is not None:
            tracer.on_step(out, res, timing)
        steps += 1
    elapsed = time.perf_counter() - t0
    if recorder is not None:
        recorder.close()
        os.unlink(path)
    return elapsed / steps, steps


def measure(num_requests: int = 400, num_seqs: int = 128, repeats: int = 3) -> dict:
    """Microseconds per step for each mode (best of `repeats`), and the steps per run."""
    result = {}
    for mode in ("off", "events", "tracer", "recorder"):
        best, steps = min(_drive(num_requests, num_seqs, mode) for _ in range(repeats))
        result[mode] = best * 1e6
        result["steps"] = steps
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=400)
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    r = measure(args.num_requests, args.max_num_seqs, args.repeats)
    print(f"{args.num_requests} requests, max_num_seqs {args.max_num_seqs}, {r['steps']} steps; us per step (best of "
          f"{args.repeats}):")
    for mode, what in (("off", "tracing off (enable_trace=False)"), ("events", "C++ events on, dropped"),
                       ("tracer", "+ StepTracer record"), ("recorder", "+ TraceRecorder, JSONL file")):
        print(f"  {what:36s} {r[mode]:9.1f}   (+{r[mode] - r['off']:.1f})")


if __name__ == "__main__":
    main()
