"""The instruction-set variants of the CPU kernels (attention, linear, rms_norm, rotary_embedding):
Isa of cpp/kernels/cpu_isa.h, one set of names for every kernel. "auto" runs the active one
(_core.kernel_isa(): this CPU's best, PAGEDCORE_KERNEL_ISA, or _core.set_kernel_isa's); tests name
each variant to run them all.

dispatch_report() lists what every kernel family (attention, dense linear, norms, quantized linear,
the library GEMM and its row thresholds) runs on this CPU: `pagedcore bench roofline` prints it and
the engine logs it once at model load (log_dispatch)."""

from __future__ import annotations

import functools

from pagedcore import _core

# Isa codes of cpp/kernels/cpu_isa.h (a name's index in _core.kernel_isa_names()); -1: the active
# one at each call. generic16* emulate the AVX-512 tilings on any CPU; avx512_vnni and amx_* are
# named for a later issue and not built yet (never supported).
ISA_CODES = {"auto": -1, **{name: code for code, name in enumerate(_core.kernel_isa_names())}}


def auto_isa() -> str:
    """The variant "auto" runs now: generic, generic16, avx2, avx512, avx512_bf16, ..."""
    return _core.kernel_isa()


def supported_isas() -> list[str]:
    """Every variant this CPU (and build) can run."""
    return [name for name, code in ISA_CODES.items() if code >= 0 and _core.kernel_isa_supported(name)]


def isa_code(name: str) -> int:
    """The Isa code of `name`; raises ValueError for an unknown name or one this CPU cannot run."""
    code = ISA_CODES.get(name)
    if code is None:
        raise ValueError(f"unknown ISA {name!r}; use one of {', '.join(ISA_CODES)}")
    if code >= 0 and not _core.kernel_isa_supported(name):
        raise ValueError(f"this CPU (or build) cannot run the {name} kernels; supported: "
                         f"{', '.join(supported_isas())}")
    return code


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's /proc/cpuinfo flags (empty where there is none): what the library GEMMs can use
    beyond the kernels' ISAs (AMX tiles)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


# Which variant each kernel family runs for an active ISA (cpp/kernels: paged_attention.cc
# pick_kernel, linear.cc linear_isa_kernels (norms and rotary share it), quant_linear.cc
# quant_kernel_isa). generic16_bf16 emulates avx512_bf16 (attention's pair-dot tiles included).
_ATTENTION_VARIANT = {"avx512_vnni": "avx512", "amx_bf16": "avx512_bf16", "amx_int8": "avx512_bf16"}
_PAIR_DOT_ATTENTION = frozenset({"avx512_bf16", "generic16_bf16"})
_REPORTED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8")
_QUANT_VARIANT = {"generic16_bf16": "generic16", "avx512_bf16": "avx512_vnni"}


def _attention_report(isa: str) -> str:
    variant = _ATTENTION_VARIANT.get(isa, isa)
    dot = "; a bf16 cache: vdpbf16ps pair dot products" if variant in _PAIR_DOT_ATTENTION else ""
    return f"{variant} (paged, prefill and decode{dot}; no AMX variant)"


def _quant_variant(isa: str) -> str:
    mapped = getattr(_core, "quant_kernel_isa", None)  # the C++ mapping, where it is bound
    if mapped is not None:
        return mapped(isa)
    if isa == "avx512" and "avx512_vnni" in cpu_flags():
        return "avx512_vnni"  # the active avx512 on a VNNI CPU runs vpdpbusd
    if isa == "avx512_bf16" and "avx512_vnni" not in cpu_flags():
        return "avx512"
    return _QUANT_VARIANT.get(isa, isa)


def _repack_report() -> str:
    """Which GGUF formats are repacked into 16-row groups at load on this CPU (ops/quant_repack.py)."""
    import os

    from pagedcore.ops.quant_repack import REPACKED, repackable

    if os.environ.get("PAGEDCORE_QUANT_REPACK", "1") == "0":
        return "file layout (PAGEDCORE_QUANT_REPACK=0)"
    on = [fmt for fmt in sorted(REPACKED) if repackable(fmt, 16)]
    off = [fmt for fmt in sorted(REPACKED) if fmt not in on]
    return ((f"{', '.join(on)} repacked into 16-row groups at load (x16 kernels)" if on else
             "file layout (no 16-lane kernel for this ISA)") + (f"; {', '.join(off)} as in the file" if on and off else ""))


def dispatch_report() -> list[tuple[str, str]]:
    """(kernel family, what runs it on this CPU now) for every family: one line each, as `pagedcore
    bench roofline` prints and the engine logs at model load."""
    import torch

    from pagedcore.ops.linear_dispatch import gemm_isa, gemm_plan

    isa = auto_isa()
    dense = {"avx512_bf16": "avx512_bf16 (bf16 x bf16: vdpbf16ps; fp32: AVX-512 FMA)",
             "generic16_bf16": "generic16_bf16 (portable emulation of avx512_bf16)"}.get(isa, isa)
    flags = " ".join(f for f in _REPORTED_FLAGS if f in cpu_flags()) or "no x86 SIMD flags"
    rows = [
        ("cpu", f"{flags}; kernel ISA {isa} (supported: {', '.join(supported_isas())})"),
        ("attention", _attention_report(isa)),
        ("dense linear kernel", dense),
        ("norms + rotary", f"{dense.split(' ')[0]} (fused add+RMSNorm, RoPE)"),
        ("quantized linear", f"{_quant_variant(isa)} (GGUF blocks / int8 per channel)"),
        ("quantized layout", _repack_report()),
    ]
    from pagedcore.ops.dense_repack import dense_repack_enabled

    for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        if dense_repack_enabled(dtype):   # every row count runs the x16 kernel: no library hand-off
            rows.append((f"dense {name} GEMM plan", f"{name}x16 repacked at load: our kernel at every row count "
                         "(PAGEDCORE_DENSE_REPACK=0: the checkpoint layout and the library plan)"))
            continue
        plan = gemm_plan(dtype)
        measured = not plan.measured.startswith("not measured")
        source = "measured on " + plan.measured.split(" (")[0] if measured else "not measured here"
        rows.append((f"dense {name} GEMM plan", f"{plan.describe()} [table row {gemm_isa()}: {source}]"))
    from pagedcore.layers.held_weights import hold_16bit_enabled

    rows.append(("16-bit weights, fp32 x", (
        "a checkpoint's bf16 / fp16 tensors held as stored under fp32 activations, widened in registers "
        f"({'vcvtph2ps / bf16 shifts' if isa.startswith('avx') else 'portable widening'}): the fp32 sums at half "
        "the bytes" if hold_16bit_enabled() else "widened to fp32 at load (PAGEDCORE_HOLD_16BIT=0)")))
    rows.append(("fp8 weights", _fp8_report(isa)))
    rows.append(("library GEMM ISA", _library_isa()))
    from pagedcore import _core

    rows.append(("kernel threads", f"{_core.kernel_threading()} now; an engine takes the kernels' pool where every "
                 "linear layer runs these kernels, else torch's OpenMP team (ops/kernel_threading.py; "
                 "PAGEDCORE_KERNEL_THREADING=pool|openmp forces either)"))
    return rows


def _fp8_report(isa: str) -> str:
    """How fp8 e4m3 weights (vLLM's "fp8", compressed-tensors float-quantized) run: W8A16 on the dense kernels."""
    import os

    widen = "vcvtph2ps through fp16" if isa.startswith("avx") else "portable widening"
    layout = ("rows of whole 16-row groups repacked at load (fp8_e4m3x16)"
              if os.environ.get("PAGEDCORE_QUANT_REPACK", "1") != "0" else "rows as stored (PAGEDCORE_QUANT_REPACK=0)")
    if isa in ("avx512_bf16", "generic16_bf16"):
        bf16 = ("bf16 x (--dtype bfloat16): the x16 layout's bytes converted to bf16 pairs exactly (vpermi2b tables) "
                f"and multiplied on {'vdpbf16ps' if isa == 'avx512_bf16' else 'its emulation'}")
    else:
        bf16 = "bf16 x widened to fp32 (this ISA has no bf16 dot)"
    return (f"e4m3 bytes widened in registers ({widen}) against fp32 x (never quantized), each row's sum times its "
            f"fp32 scale in the epilogue: the fp32 sums at a quarter of the bytes; {bf16}; {layout}")


def _library_isa() -> str:
    """What oneDNN / MKL can use on this CPU (from the flags; oneDNN picks its own kernels)."""
    flags = cpu_flags()
    if "amx_bf16" in flags:
        onednn = "AMX tiles (avx512_core_amx) for bf16"
    elif "avx512_bf16" in flags:
        onednn = "avx512_core_bf16 (vdpbf16ps) for bf16"
    elif "avx512f" in flags:
        onednn = "avx512_core, bf16 without bf16 instructions (slow)"
    else:
        onednn = "avx2, bf16 without bf16 instructions (slow)"
    mkl = "MKL fp32: AVX2 code path on AMD CPUs" if _is_amd() else "MKL fp32: its best path for this CPU"
    return f"oneDNN {onednn}; {mkl}"


def _is_amd() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("vendor_id") and "AuthenticAMD" in line for line in f)
    except OSError:
        return False


def log_dispatch(logger) -> None:
    """Logs dispatch_report() once per process (the engine calls it at model load)."""
    global _logged
    if _logged:
        return
    _logged = True
    for family, what in dispatch_report():
        logger.info("kernel dispatch: %-22s %s", family, what)


_logged = False
