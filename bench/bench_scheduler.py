"""Cost of one scheduler step (schedule + SchedulerOutput build + update) through the binding.

    .venv/bin/python bench/bench_scheduler.py

Scenario A: 256 running sequences with 1-2k-token contexts, one decode token each.
Scenario B: a step that admits 64 new prompts of 512 tokens sharing a 384-token cached prefix.
Prints microseconds per step (median over repeats). Target (issue 2): < 100 us for scenario A.
"""

import statistics
import time

import numpy as np

from pagedcore import _core


def decode_256(block_size=16, steps=200):
    rng = np.random.default_rng(0)
    cfg = _core.SchedulerConfig(num_gpu_blocks=40000, block_size=block_size, max_num_batched_tokens=8192,
                                max_num_seqs=256, max_model_len=4096, enable_prefix_caching=True)
    s = _core.Scheduler(cfg)
    for i in range(256):
        s.add_sequence(i, rng.integers(10, 40000, int(rng.integers(1024, 2048))), max_tokens=100000)
    while True:  # prefill everything (not timed)
        out = s.schedule()
        s.update(np.full(len(out.sample_seq_ids), 5))
        if out.num_decode_tokens == 256:
            break
    times = []
    tokens = np.full(256, 5, dtype=np.int64)
    for _ in range(steps):
        t0 = time.perf_counter()
        out = s.schedule()
        s.update(tokens)
        times.append(time.perf_counter() - t0)
    assert out.num_seqs == 256 and out.num_tokens == 256
    return statistics.median(times) * 1e6, out.max_num_blocks_per_seq


def admit_64_with_prefix_hits(block_size=16, repeats=30):
    rng = np.random.default_rng(1)
    system = rng.integers(10, 40000, 384)
    times = []
    hits = 0
    for r in range(repeats):
        cfg = _core.SchedulerConfig(num_gpu_blocks=8000, block_size=block_size, max_num_batched_tokens=64 * 512,
                                    max_num_seqs=256, max_model_len=4096, enable_prefix_caching=True)
        s = _core.Scheduler(cfg)
        s.add_sequence(10**6, np.concatenate([system, rng.integers(10, 40000, 16)]), max_tokens=1)
        out = s.schedule()
        s.update(np.full(len(out.sample_seq_ids), 5))  # the system prompt is now cached
        for i in range(64):
            s.add_sequence(i, np.concatenate([system, rng.integers(10, 40000, 128)]), max_tokens=16)
        t0 = time.perf_counter()
        out = s.schedule()
        s.update(np.full(len(out.sample_seq_ids), 5))
        times.append(time.perf_counter() - t0)
        assert out.num_seqs == 64
        hits = s.stats().prefix_hit_tokens
    return statistics.median(times) * 1e6, hits


if __name__ == "__main__":
    us, width = decode_256()
    print(f"A  256 running seqs, 1-2k context, decode step : {us:8.1f} us/step  "
          f"(block table width {width}; target < 100 us)")
    us, hits = admit_64_with_prefix_hits()
    print(f"B  admit 64 prompts (384 cached + 128 new tokens): {us:8.1f} us/step  (prefix hit tokens {hits})")
