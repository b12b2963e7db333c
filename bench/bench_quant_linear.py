"""The quantized linear kernels (pagedcore.ops.quant_linear) per weight format and ISA path at the
default model's shapes (SmolLM2-135M): GB/s of weight bytes streamed at M = 1 against the read probe
(_core.linear_read_probe: what any kernel can stream), and GFLOP/s at M = 16, 128, 512 against torch's
fp32 GEMM (F.linear) on the dequantised weight.

    .venv/bin/python bench/bench_quant_linear.py                        # every format x ISA (~3 min)
    .venv/bin/python bench/bench_quant_linear.py --formats q4_1 q8_0 --isas avx512_vnni avx2
    .venv/bin/python bench/bench_quant_linear.py --rows 512 --shapes gate_up   # the prefill case
    .venv/bin/python bench/bench_quant_linear.py --formats q4_k q4_kx16 --shapes down 1b_down --rows 1

Each M = 1 case cycles through enough copies of the weight (>= --mbytes) that every call reads it
from memory, as a decode step does; best of --repeats sweeps (other jobs only slow a sweep down).
The machine is shared: the CPU and the 1-minute load average are printed with the figures.
--cpu-time times one thread by its CPU time (time.process_time) instead of the wall clock: on a
machine loaded by other jobs it still shows what a core does when it runs (cache sharing with the
other jobs still slows it), where wall-clock figures mostly show the scheduler.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

# name: (N, K). gate_up is the fused gate/up projection (2 x 1536 rows).
SHAPES = {"qkv": (576, 576), "kv": (192, 576), "gate_up": (3072, 576), "down": (576, 1536),
          "lm_head": (49152, 576),
          # K a multiple of 256 (the k-quants' super-block): SmolLM2-1.7B / Llama-3.2-1B shapes.
          "1b_qkv": (3072, 2048), "1b_gate_up": (16384, 2048), "1b_down": (2048, 8192)}
_BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "q4_k": 144, "q5_k": 176, "q6_k": 210}
_F16_OFFSETS = {"q8_0": [0], "q4_0": [0], "q4_1": [0, 2], "q5_0": [0], "q5_1": [0, 2], "q4_k": [0, 2], "q5_k": [0, 2],
                "q6_k": [208]}


def cpu_line() -> str:
    name = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}"


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[0]
    except OSError:
        return "?"


def random_weight(fmt: str, N: int, K: int, rng: np.random.Generator):
    """(weight of `fmt`, per-row scales (int8, fp8) or None); a repacked format (q4_kx16, ...) is the ggml weight
    repacked."""
    from pagedcore.ops.quant_linear import FP8_FORMATS, INT8_FORMAT, row_bytes
    if fmt.endswith("x16"):
        from pagedcore.ops.quant_repack import repack_x16

        ggml = fmt.removesuffix("x16")
        weight, scales = random_weight(ggml, N, K, rng)
        return repack_x16(weight, ggml, K), scales
    if fmt == INT8_FORMAT:
        return torch.from_numpy(rng.integers(-127, 128, size=(N, K), dtype=np.int8)), torch.full((N,), 0.01)
    if fmt in FP8_FORMATS:  # e4m3 codes, the NaN codes (0x7f, 0xff) avoided
        codes = rng.integers(0, 256, size=(N, K), dtype=np.uint8)
        codes[(codes & 0x7F) == 0x7F] = 0
        return torch.from_numpy(codes), torch.full((N,), 0.01)
    raw = rng.integers(0, 256, size=(N, row_bytes(fmt, K)), dtype=np.uint8)
    blocks = raw.reshape(N, -1, _BLOCK_BYTES[fmt])
    for off in _F16_OFFSETS[fmt]:
        blocks[:, :, off:off + 2] = np.full(blocks.shape[:2], 1e-3, np.float16).view(np.uint8).reshape(
            *blocks.shape[:2], 2)
    return torch.from_numpy(raw), None


CLOCK = time.perf_counter


def best_sweep(fn, items, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = CLOCK()
        for it in items:
            fn(it)
        best = min(best, (CLOCK() - t0) / len(items))
    return best


def main(argv=None) -> int:
    from pagedcore import _core
    from pagedcore.ops.linear_isa import ISA_CODES
    from pagedcore.ops.quant_linear import GGUF_FORMATS, INT8_FORMAT, QUANT_FORMATS, QuantLinearKernel

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--formats", nargs="+", default=list(GGUF_FORMATS) + [INT8_FORMAT], choices=QUANT_FORMATS,
                    help="any kernel format, the repacked x16 ones too (q4_1x16, q4_kx16, ...)")
    ap.add_argument("--isas", nargs="+", default=["generic", "avx2", "avx512", "avx512_vnni"])
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 16, 128, 512])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--mbytes", type=int, default=192, help="weight copies cycled per M = 1 sweep (MB)")
    ap.add_argument("--cpu-time", action="store_true", help="one thread, timed by its CPU time")
    ap.add_argument("--generic-max-rows", type=int, default=16,
                    help="the portable path (~4 GFLOP/s) only up to this many rows, to keep the run short")
    args = ap.parse_args(argv)
    global CLOCK
    if args.cpu_time:
        args.threads = 1
        CLOCK = time.process_time
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    isas = [i for i in args.isas if _core.kernel_isa_supported(i)]
    skipped = [i for i in args.isas if i not in isas]
    rng = np.random.default_rng(0)

    probe_buf = torch.empty(512 << 20, dtype=torch.uint8).fill_(1)
    probe = {}
    for isa in isas:
        t = best_sweep(lambda _: _core.linear_read_probe(probe_buf.data_ptr(), probe_buf.numel(), threads,
                                                         ISA_CODES[isa]), [0], args.repeats)
        probe[isa] = probe_buf.numel() / t / 1e9
    del probe_buf
    print(f"# {cpu_line()}; load average {loadavg()} (shared machine: figures are noisy); "
          f"{'CPU time of one thread' if args.cpu_time else 'wall clock'}")
    print(f"# read probe GB/s: " + ", ".join(f"{i} {probe[i]:.1f}" for i in isas)
          + (f"; not run (CPU lacks): {', '.join(skipped)}" if skipped else ""))
    print(f"{'format':>16} {'shape':>8} {'N':>6} {'K':>5} {'isa':>12} {'M':>4} {'us':>9} {'GB/s':>7} "
          f"{'%probe':>6} {'GFLOP/s':>8} {'torch fp32':>10} {'load':>5}")
    for fmt in args.formats:
        for shape in args.shapes:
            N, K = SHAPES[shape]
            if shape == "lm_head" and fmt.removesuffix("x16") != "q8_0":
                continue  # the lm head ships as Q8_0 (tied embeddings)
            if fmt.removesuffix("x16").endswith("_k") and K % 256:
                continue  # K = 576 is not a multiple of the k-quants' 256-weight super-block
            weight, scales = random_weight(fmt, N, K, rng)
            wbytes = weight.numel()
            copies = max(1, (args.mbytes << 20) // wbytes)
            weights = [weight] + [weight.clone() for _ in range(copies - 1)]
            w32 = torch.randn(N, K)
            for M in args.rows:
                x = torch.randn(M, K)
                torch_t = best_sweep(lambda _: F.linear(x, w32), range(max(3, 50 // max(1, M // 16))),
                                     args.repeats) if M > 1 else None
                for isa in isas:
                    if isa.startswith("generic") and M > args.generic_max_rows:
                        continue
                    if M == 1:
                        kernels = [QuantLinearKernel(w, fmt, K, scales=scales, isa=isa) for w in weights]
                        t = best_sweep(lambda k: k(x), kernels, args.repeats)
                    else:
                        k = QuantLinearKernel(weight, fmt, K, scales=scales, isa=isa)
                        reps = max(3, int(2e8 / (2 * M * N * K)))
                        t = best_sweep(lambda _: k(x), range(reps), args.repeats)
                    gbs = wbytes / t / 1e9
                    gflops = 2 * M * N * K / t / 1e9
                    tgf = f"{2 * M * N * K / torch_t / 1e9:10.1f}" if torch_t else f"{'':>10}"
                    print(f"{fmt:>16} {shape:>8} {N:>6} {K:>5} {isa:>12} {M:>4} {t * 1e6:9.1f} {gbs:7.1f} "
                          f"{100 * gbs / probe[isa]:6.0f} {gflops:8.1f} {tgf} {loadavg():>5}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
