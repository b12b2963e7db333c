"""The instruction-set variants of the CPU kernels (attention, linear, rms_norm, rotary_embedding):
Isa of cpp/kernels/cpu_isa.h, one set of names for every kernel. "auto" runs the active one
(_core.kernel_isa(): this CPU's best, PAGEDCORE_KERNEL_ISA, or _core.set_kernel_isa's); tests name
each variant to run them all."""

from __future__ import annotations

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
