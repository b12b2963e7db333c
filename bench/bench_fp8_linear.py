"""fp8 e4m3 weights in the x16 layout (ops/quant_linear.py) with one scale per row against block-wise scales
(DeepSeek / Qwen3 FP8's 128 x 128: each k-block's sum scaled as it ends) and the dense bf16x16 kernel, at the
default model's shapes and at Qwen3-0.6B's (the smallest block-FP8 model on the hub), fp32 and bf16 x:
microseconds per call at M = 1 with the weights read from memory (copies cycled, as a decode step reads them)
and GFLOP/s at --rows (weights in cache), best of --repeats; the CPU's model name is printed with the figures.

    .venv/bin/python bench/bench_fp8_linear.py
    .venv/bin/python bench/bench_fp8_linear.py --shapes q06_gate_up --rows 256 --x-dtypes bfloat16
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from pagedcore.ops.quant_linear import QuantLinearKernel
from pagedcore.ops.quant_repack import repack_x16

# name: (N, K)
SHAPES = {"qkv": (960, 576), "gate_up": (3072, 576), "down": (576, 1536),
          "q06_qkv": (4096, 1024), "q06_o": (1024, 2048), "q06_gate_up": (6144, 1024), "q06_down": (1024, 3072)}
VARIANTS = ("fp8_row", "fp8_block128", "bf16x16")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


def kernel(variant: str, N: int, K: int, x_dtype: torch.dtype, gen: torch.Generator):
    """(the bound kernel, bytes it reads per call) over fresh random weights."""
    if variant == "bf16x16":
        from pagedcore.ops.dense_repack import pack_x16
        from pagedcore.ops.linear import LinearKernel

        w = (torch.randn(N, K, generator=gen) * 0.05).to(torch.bfloat16)
        return LinearKernel(pack_x16(w), x_dtype=x_dtype, out_dtype=torch.float32, x16=True), w.nbytes
    codes = torch.randint(0, 256, (N, K), dtype=torch.uint8, generator=gen)
    codes = torch.where((codes & 0x7F) == 0x7F, codes ^ 1, codes)  # no NaN codes
    packed = repack_x16(codes, "fp8_e4m3", K)
    if variant == "fp8_row":
        scales = torch.rand(N, generator=gen) * 1e-3 + 1e-3
        return QuantLinearKernel(packed, "fp8_e4m3x16", K, scales=scales, x_dtype=x_dtype,
                                 out_dtype=torch.float32), N * K + 4 * N
    scales = torch.rand(N // 16, -(-K // 128), generator=gen) * 1e-3 + 1e-3
    return QuantLinearKernel(packed, "fp8_e4m3x16", K, scales=scales.contiguous(), x_dtype=x_dtype,
                             out_dtype=torch.float32, block_k=128), N * K + scales.nbytes


def time_calls(kernels, x, calls: int) -> float:
    """Seconds per call, cycling the kernels (each reads its own weights)."""
    start = time.perf_counter()
    for i in range(calls):
        kernels[i % len(kernels)](x)
    return (time.perf_counter() - start) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--x-dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--mbytes", type=int, default=192, help="weight copies cycled at M = 1 (MB)")
    args = ap.parse_args()
    print(f"{cpu_name()}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.2f}")
    print(f"{'shape':12} {'x':9} {'variant':13} {'M=1 us':>8} {'GB/s':>6} {'M=' + str(args.rows) + ' GFLOP/s':>14}")
    gen = torch.Generator().manual_seed(0)
    for shape in args.shapes:
        N, K = SHAPES[shape]
        for x_name in args.x_dtypes:
            x_dtype = getattr(torch, x_name)
            x1 = torch.randn(1, K, generator=gen).to(x_dtype)
            xm = torch.randn(args.rows, K, generator=gen).to(x_dtype)
            for variant in args.variants:
                first, nbytes = kernel(variant, N, K, x_dtype, gen)
                copies = [first] + [kernel(variant, N, K, x_dtype, gen)[0]
                                    for _ in range(max(1, args.mbytes * 2**20 // nbytes) - 1)]
                time_calls(copies, x1, len(copies))  # warm: page the copies in
                one = min(time_calls(copies, x1, 2 * len(copies)) for _ in range(args.repeats))
                time_calls([first], xm, 3)
                many = min(time_calls([first], xm, 5) for _ in range(args.repeats))
                print(f"{shape:12} {x_name:9} {variant:13} {one * 1e6:8.1f} {nbytes / one / 1e9:6.1f} "
                      f"{2 * args.rows * N * K / many / 1e9:14.1f}")


if __name__ == "__main__":
    main()
