"""Which code runs a dense linear call of M rows on this CPU: pagedcore's own kernel up to a row
threshold, a library GEMM above it. Both choices come from a table measured per instruction set
(bench/bench_linear.py --library), not from one machine's constants.

    plan = gemm_plan(torch.bfloat16)      # GemmPlan(kernel_max_rows=128, library="torch", ...)

The libraries (what DenseLinearMethod runs above kernel_max_rows):
    torch          F.linear as is: MKL's GEMM for fp32 (on AMD CPUs MKL takes its AVX2 path),
                   oneDNN with a per-call weight reorder for bf16
    widen          bf16 weights widened to fp32 for the call, MKL's fp32 GEMM, one rounding back to
                   bf16: for CPUs without AVX512-BF16/AMX, where torch's bf16 GEMM runs at ~25 GFLOP/s
    onednn_packed  oneDNN with the weight reordered once at load (ops/onednn_linear.py)

The table is keyed by gemm_isa(): the CPU kernels' active ISA (_core.kernel_isa()), except that a CPU
with AMX-BF16 is its own row (oneDNN uses the tiles there; our kernels have no AMX variant yet).
Rows not measured say so in `measured` and borrow the nearest measured row.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import torch

from pagedcore.ops.linear_isa import auto_isa, cpu_flags

__all__ = ["GemmPlan", "GEMM_PLANS", "LIBRARIES", "gemm_isa", "gemm_plan"]

LIBRARIES = ("torch", "widen", "onednn_packed")
# How a row is measured: the GEMMs alone, then the workload with the candidate thresholds.
MEASURE_COMMAND = (".venv/bin/python bench/bench_linear.py --library  (then bench throughput with "
                   "PAGEDCORE_LINEAR_MAX_ROWS / PAGEDCORE_LINEAR_LIBRARY set to the candidates)")


@dataclasses.dataclass(frozen=True)
class GemmPlan:
    """Dense linear calls of up to kernel_max_rows rows run the kernel (and small steps the C++
    decoder stack, which uses the same threshold); larger ones `library`."""

    kernel_max_rows: int
    library: str
    measured: str  # where and how the row was measured, or why it was not

    def describe(self) -> str:
        return f"kernel up to {self.kernel_max_rows} rows, above: {self.library}"


_AVX2_NOTE = ("2-core AMD EPYC Zen 4 VM with AVX2 only, 2026-11-29, bench_linear.py: fp32 kernel 2-2.9x "
              "MKL at 16 rows, ~even at 256; torch's bf16 GEMM 15-36 GFLOP/s at every size")
_ZEN5_NOTE = ("2-core AMD EPYC Zen 5 (AVX512-BF16, no AMX), 2026-12-02, bench_linear.py --library --threads 1 "
              "(load 14-20: 2-thread figures unusable): fp32 oneDNN prepacked 160-210 GFLOP/s vs MKL 80-97 "
              "(MKL runs AVX2 code on AMD) and our kernel 130-165, ahead of ours from 24 rows; bf16 torch's "
              "own GEMM (oneDNN, no prepack) 280-390 = prepacked within noise, ahead of our 260-300 from ~48 "
              "rows. Rows kept at 128: the C++ decoder stack and the tied lm_head use the same threshold, "
              "and the lm_head's library path is MKL (2x slower than ours in fp32); re-tune end to end")

_FP16_NOTE = ("fp16 weights under fp32 x (a held GPTQ / AWQ head or table): the kernel widens them as it does "
              "bf16's, up to the bf16 row's rows; above, torch with the weight widened for the call. Not measured")

# gemm_isa() -> weight dtype -> plan.
GEMM_PLANS: dict[str, dict[torch.dtype, GemmPlan]] = {
    "avx2": {torch.float32: GemmPlan(128, "torch", _AVX2_NOTE),
             torch.bfloat16: GemmPlan(256, "widen", _AVX2_NOTE)},
    # AVX-512 without BF16 (Skylake-X, Cascade Lake): not measured; bf16 GEMMs have no bf16
    # instructions here, so widen as on AVX2.
    "avx512": {torch.float32: GemmPlan(128, "torch", "not measured: the AVX2 row"),
               torch.bfloat16: GemmPlan(256, "widen", "not measured: the AVX2 row")},
    "avx512_bf16": {torch.float32: GemmPlan(128, "onednn_packed", _ZEN5_NOTE),
                    torch.bfloat16: GemmPlan(128, "torch", _ZEN5_NOTE)},
    # AMX-BF16 (Sapphire Rapids and later): oneDNN runs bf16 on the tiles, so the library should win
    # from fewer rows than on Zen 5. Not measured on this project's machines yet: measure with
    # MEASURE_COMMAND on an AMX Xeon and replace this row.
    "amx_bf16": {torch.float32: GemmPlan(128, "onednn_packed", "not measured: the avx512_bf16 row"),
                 torch.bfloat16: GemmPlan(128, "onednn_packed", "not measured: prepacked, as vLLM-CPU runs "
                                          "there (a per-call reorder weighs more against AMX's rate)")},
}
# ISAs with no row of their own -> the row they borrow.
_FALLBACK = {"generic": "avx2", "generic16": "avx2", "generic16_bf16": "avx2", "avx512_vnni": "avx512"}


def gemm_isa() -> str:
    """The GEMM_PLANS row of this CPU: amx_bf16 where the CPU has AMX-BF16, else the kernels' ISA."""
    if "amx_bf16" in cpu_flags():
        return "amx_bf16"
    isa = auto_isa()
    return isa if isa in GEMM_PLANS else _FALLBACK.get(isa, "avx2")


@functools.lru_cache(maxsize=None)
def _library_ok(library: str, weight_dtype: torch.dtype) -> str:
    """"" if `library` can run here for weights of `weight_dtype`, else why not."""
    if library == "onednn_packed":
        from pagedcore.ops.onednn_linear import unavailable_reason
        return unavailable_reason(weight_dtype)
    return ""


def gemm_plan(weight_dtype: torch.dtype, isa: str | None = None) -> GemmPlan:
    """The plan for a dense weight of `weight_dtype` on this CPU (or the GEMM_PLANS row `isa`).
    Overrides: PAGEDCORE_LINEAR_MAX_ROWS=<n> (0: the library at every size) and
    PAGEDCORE_LINEAR_LIBRARY=torch|widen|onednn_packed; PAGEDCORE_WIDEN_BF16_GEMM=0/1 (the older
    switch) picks widen or torch for bf16."""
    row = GEMM_PLANS[isa or gemm_isa()]
    plan = row.get(weight_dtype, row[torch.float32])
    if weight_dtype is torch.float16:  # weights only: a GPTQ / AWQ checkpoint's head or table held as stored
        plan = GemmPlan(row[torch.bfloat16].kernel_max_rows, "torch", _FP16_NOTE)
    rows, library, note = plan.kernel_max_rows, plan.library, plan.measured
    env_rows = os.environ.get("PAGEDCORE_LINEAR_MAX_ROWS")
    if env_rows is not None:
        try:
            rows = max(int(env_rows), 0)
        except ValueError:
            raise ValueError(f"PAGEDCORE_LINEAR_MAX_ROWS={env_rows!r} is not an integer; set a row count "
                             "(0 = always the library GEMM)") from None
        note = f"PAGEDCORE_LINEAR_MAX_ROWS={rows}"
    widen_env = os.environ.get("PAGEDCORE_WIDEN_BF16_GEMM")
    if weight_dtype is torch.bfloat16 and widen_env in ("0", "1"):
        library = "widen" if widen_env == "1" else "torch"
    env_lib = os.environ.get("PAGEDCORE_LINEAR_LIBRARY")
    if env_lib is not None:
        if env_lib not in LIBRARIES:
            raise ValueError(f"PAGEDCORE_LINEAR_LIBRARY={env_lib!r}; use one of {', '.join(LIBRARIES)}")
        library = env_lib
    if library == "widen" and weight_dtype is not torch.bfloat16:
        library = "torch"  # nothing to widen
    if _library_ok(library, weight_dtype):
        library = "widen" if weight_dtype is torch.bfloat16 and auto_isa() not in ("avx512_bf16",) else "torch"
    if (rows, library, note) == (plan.kernel_max_rows, plan.library, plan.measured):
        return plan
    return GemmPlan(rows, library, note)
