"""The linear kernel (pagedcore.ops.linear) against torch.nn.functional.linear at SmolLM2-135M's
shapes: µs per call, weight GB/s, GFLOP/s, and the ratio; plus the read bandwidth it is held to.

    .venv/bin/python bench/bench_linear.py                       # fp32 and bf16, M = 1 .. 2048 (~2 min)
    .venv/bin/python bench/bench_linear.py --rows 1 16 --dtype bfloat16
    .venv/bin/python bench/bench_linear.py --threads 1           # per core: steadier on a shared machine

Each case cycles through enough copies of the weight (>= 256 MB) that every call reads it from
memory, as a decode step does; the figure is the best of --repeats sweeps (other jobs only ever slow
a sweep down). GB/s = weight bytes / time; GFLOP/s = 2 M N K / time.

Measured 2026-11-30 on the development VM (AMD EPYC Zen 4, 2 cores, AVX2/FMA, no AVX-512), quiet
moments between other jobs; read probe 41 GB/s on 2 threads, 22 GB/s on 1:

  2 threads, M = 1 (GB/s of weights)     ours fp32  torch fp32   ours bf16  torch bf16
    qkv      960 x  576                     ~35        10.5         ~33        22.6
    gate_up 3072 x  576                     ~37        11.0         ~40        23.2
    down     576 x 1536                     ~36        15.0         ~35        28.7
    lm_head 49152 x 576                     ~37        10.8         ~40        25.7
  1 thread, GFLOP/s at M = 4 / 16 / 64 / 256 (gate_up 3072 x 576)
    ours fp32  44 / 64 / 68 / 70       torch fp32 (MKL)  ~20 / 37 / 50 / 55
    ours bf16  51 / 65 / 68 / 70       torch bf16        ~10 / 12 / 14 / 15
  torch's bf16 GEMM has no fast path on a CPU without AVX512-BF16: ~25-30 GFLOP/s on 2 threads at
  every M (fp32 MKL: 100-128), so bf16 layers use the kernel at every size here; fp32 ones up to
  pagedcore.ops.linear.max_rows rows.

--library compares, at many rows, every way to run the GEMM (what pagedcore.ops.linear_dispatch's
per-ISA threshold table is measured with; interleaved, best of --repeats):

    .venv/bin/python bench/bench_linear.py --library                       # M = 16 .. 2048, fp32 + bf16
    .venv/bin/python bench/bench_linear.py --library --dtype bfloat16 --rows 64 128 256

  ours      pagedcore's kernel (LinearKernel) over the checkpoint layout
  x16       pagedcore's outer-product kernel over the weight repacked once (ops/dense_repack.py)
  widen     F.linear on fp32 copies of bf16 operands, rounded back (the AVX2 path for bf16)
  torch     F.linear as is (MKL for fp32, oneDNN with a per-call weight reorder for bf16)
  packed    oneDNN through torch.ops.mkldnn with the weight reordered once (ops/onednn_linear.py)
Figures of the Zen 5 machine: docs/performance.md, "AMD EPYC Zen 5".
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

SHAPES = {"qkv": (960, 576), "o_proj": (576, 576), "gate_up": (3072, 576), "down": (576, 1536),
          "lm_head": (49152, 576)}


def sweep_time(fn_per_weight, weights, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for w in weights:
            fn_per_weight(w)
        best = min(best, (time.perf_counter() - t0) / len(weights))
    return best


def main(argv=None) -> int:
    from pagedcore import _core
    from pagedcore.ops.linear import LinearKernel
    from pagedcore.ops.linear_isa import auto_isa

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 4, 16, 64, 256, 2048])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--mbytes", type=int, default=256, help="weight copies cycled per sweep (MB)")
    ap.add_argument("--library", action="store_true", help="ours vs torch vs oneDNN prepacked at many rows")
    ap.add_argument("--sample-mflop", type=float, default=200, help="--library: work per timed sample")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.library:
        return run_library(args)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"threads={torch.get_num_threads()}  kernel={auto_isa()}  load: {load}")
    buf = torch.ones(512 << 18)  # 512 MB
    for threads in sorted({1, torch.get_num_threads()}):
        t = min(_timed(lambda: _core.linear_read_probe(buf.data_ptr(), buf.numel() * 4, threads, -1))
                for _ in range(10))
        print(f"read probe, {threads} thread(s): {buf.numel() * 4 / t / 1e9:.1f} GB/s")
    del buf
    print(f"{'dtype':9s} {'shape':8s} {'M':>5s} | {'ours us':>9s} {'GB/s':>6s} {'GFLOP/s':>7s} | "
          f"{'torch us':>9s} {'GB/s':>6s} {'GFLOP/s':>7s} | {'speedup':>7s}")
    for dtype_name in args.dtype:
        dtype = getattr(torch, dtype_name)
        for shape in args.shapes:
            N, K = SHAPES[shape]
            wbytes = N * K * dtype.itemsize
            copies = max(2, args.mbytes * (1 << 20) // wbytes)
            weights = [torch.randn(N, K).to(dtype) for _ in range(copies)]
            kernels = {id(w): LinearKernel(w) for w in weights}
            for M in args.rows:
                x = torch.randn(M, K).to(dtype)
                reps = args.repeats if M * N * K < 1e9 else max(2, args.repeats // 2)
                sub = weights if M * N * K < 2e8 else weights[:4]
                ours = sweep_time(lambda w: kernels[id(w)](x), sub, reps)
                ref = sweep_time(lambda w: F.linear(x, w), sub, reps)
                flops = 2 * M * N * K
                print(f"{dtype_name:9s} {shape:8s} {M:5d} | {ours * 1e6:9.1f} {wbytes / ours / 1e9:6.1f} "
                      f"{flops / ours / 1e9:7.1f} | {ref * 1e6:9.1f} {wbytes / ref / 1e9:6.1f} "
                      f"{flops / ref / 1e9:7.1f} | "
                      f"{ref / ours:6.2f}x", flush=True)
    return 0


LIBRARY_ROWS = (16, 64, 128, 256, 512, 2048)
# The lm_head multiplies only the sampled rows (one per running sequence, <= max_num_seqs = 256).
LM_HEAD_MAX_ROWS = 512


def library_variants(w: torch.Tensor) -> dict:
    """name -> fn(x) for one weight [N, K]: every way pagedcore could run a many-row GEMM."""
    from pagedcore.ops.linear import LinearKernel
    from pagedcore.ops.onednn_linear import PrepackedWeight, available

    from pagedcore.ops.dense_repack import pack_x16, x16_problem

    kernel = LinearKernel(w)
    variants = {"ours": kernel, "torch": lambda x: F.linear(x, w)}
    if not x16_problem(w):
        variants["x16"] = LinearKernel(pack_x16(w), x16=True)
    if w.dtype is torch.bfloat16:  # the widen path converts the weight on every call: timed with it
        variants["widen"] = lambda x: F.linear(x.float(), w.float()).to(torch.bfloat16)
    if available(w.dtype):
        variants["packed"] = PrepackedWeight(w)
    return variants


def run_library(args) -> int:
    import os

    from pagedcore.ops.linear_isa import auto_isa

    rows = args.rows if args.rows != [1, 4, 16, 64, 256, 2048] else list(LIBRARY_ROWS)
    print(f"threads={torch.get_num_threads()}  kernel ISA={auto_isa()}  loadavg {os.getloadavg()}  "
          "(GFLOP/s, best of interleaved repeats)")
    names = ("ours", "x16", "torch", "widen", "packed")
    print(f"{'dtype':9s} {'shape':8s} {'M':>5s} | " + " ".join(f"{n:>7s}" for n in names) + " | best")
    for dtype_name in args.dtype:
        dtype = getattr(torch, dtype_name)
        for shape in args.shapes:
            N, K = SHAPES[shape]
            torch.manual_seed(0)
            weights = [torch.randn(N, K).mul_(0.05).to(dtype) for _ in range(2)]
            variants = [library_variants(w) for w in weights]
            for M in rows:
                if shape == "lm_head" and M > LM_HEAD_MAX_ROWS:
                    continue
                x = torch.randn(M, K).to(dtype)
                flops = 2 * M * N * K
                calls = max(1, int(args.sample_mflop * 1e6 // flops))  # short samples: the best one missed the load
                best = {}
                for _ in range(args.repeats):
                    for name in variants[0]:  # interleaved: load shifts hit every variant alike
                        t0 = time.perf_counter()
                        for i in range(calls):
                            variants[i % 2][name](x)
                        dt = (time.perf_counter() - t0) / calls
                        best[name] = min(best.get(name, dt), dt)
                rate = {n: flops / t / 1e9 for n, t in best.items()}
                cells = " ".join(f"{rate[n]:7.1f}" if n in rate else f"{'-':>7s}" for n in names)
                print(f"{dtype_name:9s} {shape:8s} {M:5d} | {cells} | {max(rate, key=rate.get)}", flush=True)
    return 0


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    sys.exit(main())
