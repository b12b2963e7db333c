// Which vector instruction set the CPU kernels use, chosen once at run time.
#pragma once

namespace pagedcore {
namespace kernels {

// kGeneric: portable C++ (8 lanes, auto-vectorised by the compiler for the baseline ISA).
// kGeneric16: the same portable code at 16 lanes; it runs the AVX-512 code path's algorithm on any
//             CPU, so tests cover that tiling where no AVX-512 machine is at hand.
// kAvx2: AVX2 + FMA + F16C.  kAvx512: AVX-512 F/BW/VL/DQ.
enum class Isa { kGeneric = 0, kGeneric16 = 1, kAvx2 = 2, kAvx512 = 3 };

const char* isa_name(Isa isa);
// True when this CPU (and OS) can run kernels compiled for `isa` and this build contains them.
bool isa_supported(Isa isa);
// The ISA the kernels use: the best supported one, or the one named by the environment variable
// PAGEDCORE_KERNEL_ISA (generic, generic16, avx2, avx512) when that one is supported.
Isa active_isa();
// Overrides active_isa() (tests and benchmarks); returns false and changes nothing if unsupported.
bool set_active_isa(Isa isa);

}  // namespace kernels
}  // namespace pagedcore
