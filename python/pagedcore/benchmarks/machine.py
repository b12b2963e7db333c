"""What the machine can do: CPU, ISA, and the ceilings every floor is computed against
(GEMM GFLOP/s with torch at the model's shapes, memory bandwidth), plus peak RSS.

Ceilings are measured, not looked up: a shared machine, another CPU or another torch build moves
them, and a floor is only as honest as the rate it divides by. Each figure is the best of several
timed repeats (the best is what survives a busy machine).
"""

from __future__ import annotations

import os
import platform
import resource
import time

import torch
import torch.nn.functional as F

# Flags that decide which GEMM / attention code paths a CPU can run.
ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx_vnni",
             "amx_bf16", "amx_int8", "amx_tile")


def cpu_info() -> dict:
    model, flags = platform.processor() or "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name":
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    return {"cpu": model, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "isa": [f for f in ISA_FLAGS if f in flags], "memory_gib": round(mem_gib, 1),
            "torch": torch.__version__, "load_average": os.getloadavg()}


def describe_cpu(info: dict) -> str:
    isa = info["isa"]
    note = "" if "avx512f" in isa else " (no AVX-512)"
    la = ", ".join(f"{x:.2f}" for x in info["load_average"])
    return (f"{info['cpu']}, {info['cores']} cores, torch {info['torch']} with {info['torch_threads']} threads; "
            f"ISA {' '.join(isa)}{note}; {info['memory_gib']} GiB; load average {la}")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux reports KiB


def _best_seconds(fn, min_time: float, max_repeats: int = 50) -> float:
    fn()  # warm: first calls pick kernels and fault pages in
    best, spent, repeats = float("inf"), 0.0, 0
    while (spent < min_time or repeats < 3) and repeats < max_repeats:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, spent, repeats = min(best, dt), spent + dt, repeats + 1
    return best


def linear_shapes(hidden_size: int, intermediate_size: int, q_size: int, kv_size: int) -> list[tuple[int, int]]:
    """(in, out) of one decoder layer's fused linears: qkv, o, gate_up, down."""
    return [(hidden_size, q_size + 2 * kv_size), (q_size, hidden_size),
            (hidden_size, 2 * intermediate_size), (intermediate_size, hidden_size)]


def measure_gemm(shapes: list[tuple[int, int]], num_rows: int, dtype: torch.dtype, min_time: float = 0.3,
                 library: str = "torch") -> float:
    """GFLOP/s over one layer's shapes (in, out) at num_rows rows, as the model calls it: torch's
    F.linear (library "torch") or oneDNN with prepacked weights ("onednn_packed", ops/onednn_linear.py)."""
    weights = [torch.randn(n_out, n_in).to(dtype) for n_in, n_out in shapes]
    inputs = [torch.randn(num_rows, n_in).to(dtype) for n_in, _ in shapes]
    flops = sum(2 * num_rows * n_in * n_out for n_in, n_out in shapes)
    if library == "onednn_packed":
        from pagedcore.ops.onednn_linear import PrepackedWeight
        fns = [PrepackedWeight(w) for w in weights]
    else:
        fns = [lambda x, w=w: F.linear(x, w) for w in weights]

    def run():
        for x, fn in zip(inputs, fns):
            fn(x)
    with torch.inference_mode():
        return flops / _best_seconds(run, min_time) / 1e9


def model_linear_shapes(mc) -> list[tuple[int, int]]:
    return linear_shapes(mc.hidden_size, mc.intermediate_size, mc.num_heads * mc.head_dim,
                         mc.num_kv_heads * mc.head_dim)


def peak_gemm_gflops(mc, dtype_name: str, rows=(256, 1024), min_time: float = 0.2) -> float:
    """The floor's rate: torch's best GFLOP/s over large row counts at the model's layer shapes.
    For bf16, the better of torch's bf16 GEMM and its fp32 one: where the bf16 GEMM is slow (no
    AVX512-BF16) the engine widens bf16 weights and runs the fp32 GEMM (kernels_linear.torch_linear),
    so the fp32 rate is the one its bf16 math can reach."""
    dtype = getattr(torch, dtype_name)
    rate = max(measure_gemm(model_linear_shapes(mc), m, dtype, min_time, lib) for m in rows
               for lib in _libraries(dtype))
    if dtype is torch.bfloat16:
        rate = max(rate, peak_gemm_gflops(mc, "float32", rows, min_time))
    return rate


def measure_bandwidth(num_bytes: int = 512 * 1024**2, min_time: float = 0.5) -> dict:
    """GB/s of a copy (bytes read + written, as the peer README counts it) and of a read-only sum."""
    src = torch.ones(num_bytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    with torch.inference_mode():
        copy = 2 * num_bytes / _best_seconds(lambda: dst.copy_(src), min_time) / 1e9
        read = num_bytes / _best_seconds(lambda: src.sum(), min_time) / 1e9
    return {"copy_gbps": copy, "read_gbps": read}


def measure_ceilings(model_config, rows=(1, 16, 64, 256, 1024), dtypes=("float32", "bfloat16"),
                     min_time: float = 0.3, bandwidth_bytes: int = 512 * 1024**2) -> dict:
    """GEMM GFLOP/s per dtype and row count at the model's layer shapes and its lm_head; memory bandwidth.
    'gemm_gflops' (the floor's rate) is the best over row counts >= 256, where GEMMs are compute-bound."""
    mc = model_config
    shapes = model_linear_shapes(mc)
    lm_head = [(mc.hidden_size, mc.vocab_size)]
    result = {"gemm": {}, "lm_head_gemm": {}, "gemm_gflops": {}}
    for name in dtypes:
        dtype = getattr(torch, name)
        per_rows = {m: measure_gemm(shapes, m, dtype, min_time) for m in rows}
        result["gemm"][name] = per_rows
        if "onednn_packed" in _libraries(dtype):
            packed = {m: measure_gemm(shapes, m, dtype, min_time, "onednn_packed") for m in rows}
            result.setdefault("gemm_onednn_packed", {})[name] = packed
            per_rows = {m: max(per_rows[m], packed[m]) for m in rows}  # the floor's rate: the better library
        result["lm_head_gemm"][name] = {m: measure_gemm(lm_head, m, dtype, min_time) for m in (1, 64)}
        result["gemm_gflops"][name] = max(v for m, v in per_rows.items() if m >= 256) if max(rows) >= 256 \
            else max(per_rows.values())
    result["bandwidth"] = measure_bandwidth(bandwidth_bytes, min_time)
    return result


def _libraries(dtype: torch.dtype) -> tuple[str, ...]:
    from pagedcore.ops.onednn_linear import available
    return ("torch", "onednn_packed") if available(dtype) else ("torch",)


def format_ceilings(c: dict) -> str:
    lines = []
    for name, per_rows in c["gemm"].items():
        cells = "  ".join(f"M={m}: {v:6.1f}" for m, v in per_rows.items())
        lm = "  ".join(f"M={m}: {v:6.1f}" for m, v in c["lm_head_gemm"][name].items())
        lines.append(f"  GEMM {name:<8} layer linears  {cells}  GFLOP/s (torch F.linear)")
        packed = c.get("gemm_onednn_packed", {}).get(name)
        if packed:
            cells = "  ".join(f"M={m}: {v:6.1f}" for m, v in packed.items())
            lines.append(f"  GEMM {name:<8} layer linears  {cells}  GFLOP/s (oneDNN, weights prepacked)")
        lines.append(f"  GEMM {name:<8} lm_head        {lm}  GFLOP/s")
    bw = c["bandwidth"]
    lines.append(f"  memory: copy {bw['copy_gbps']:.1f} GB/s (read + write), read-only {bw['read_gbps']:.1f} GB/s")
    return "\n".join(lines)
