// Which vector instruction set the CPU kernels (attention, linear, norms) use: one enum, one
// detection, one active choice shared by every kernel family, overridable for tests and benchmarks.
#pragma once

#include <cstdint>

namespace pagedcore {
namespace kernels {

// The codes are Python-visible (_core.kernel_isa_names() lists the names in code order).
//   kGeneric:       portable C++ at 8 lanes, auto-vectorised for the baseline ISA; runs anywhere.
//   kGeneric16:     the same portable code at 16 lanes: the AVX-512 kernels' tiling on any CPU, so
//                   tests cover it where no AVX-512 machine is at hand.
//   kAvx2:          AVX2 + FMA + F16C, 8 lanes.
//   kAvx512:        AVX-512 F/BW/VL/DQ, 16 lanes.
//   kAvx512Bf16:    kAvx512 plus AVX512-BF16 (vdpbf16ps) for bf16 activations against bf16 (and fp8)
//                   weights, and AVX512-VBMI (byte permutes: the fp8 weights' exact bf16 conversion); every
//                   AVX512-BF16 CPU but Cooper Lake has both (there kAvx512 runs). Kernels without a bf16-dot
//                   variant (attention) run their kAvx512 one.
//   kGeneric16Bf16: portable emulation of kAvx512Bf16 (its tiling and pairwise dot products).
//   kAvx512Vnni:    kAvx512 plus AVX512-VNNI (vpdpbusd): the quantized linear kernels' int8 dot
//                   products. Never chosen as the active ISA (attention and the dense kernels have
//                   no VNNI variant; named explicitly, dense linear runs its kAvx512 kernels).
// Named room for a later issue; not built, so isa_supported() is false for them: kAmxBf16,
// kAmxInt8 (tile matrix multiply; no machine of this project's to run them on yet).
//
// The quantized linear family (quant_linear.h) maps an ISA to its own kernels:
//   generic -> generic (vpmaddubsw emulation, 32 bytes)   generic16, generic16_bf16 -> generic16
//   avx2 -> avx2 (vpmaddubsw)                              (vpdpbusd emulation, 64 bytes)
//   avx512 -> avx512 (AVX-512BW vpmaddubsw), except as the active ISA (a call naming none) on a
//             CPU with AVX512-VNNI: avx512_vnni
//   avx512_bf16 -> avx512_vnni where the CPU has it (all AVX512-BF16 CPUs so far), else avx512
//   avx512_vnni -> avx512_vnni
// So the active ISA on a VNNI CPU always runs vpdpbusd, and tests can still name each path.
enum class Isa : int32_t {
  kGeneric = 0,
  kGeneric16 = 1,
  kAvx2 = 2,
  kAvx512 = 3,
  kAvx512Bf16 = 4,
  kGeneric16Bf16 = 5,
  kAvx512Vnni = 6,
  kAmxBf16 = 7,
  kAmxInt8 = 8,
};
constexpr int kNumIsas = 9;

// "generic", "generic16", "avx2", "avx512", "avx512_bf16", "generic16_bf16", "avx512_vnni",
// "amx_bf16", "amx_int8"; "unknown" for a value outside the enum.
const char* isa_name(Isa isa);
// The ISA called `name`; false (and `isa` untouched) for a name that is none of isa_name's.
bool isa_from_name(const char* name, Isa* isa);
// True when this CPU (and OS) can run kernels compiled for `isa` and this build contains them.
bool isa_supported(Isa isa);
// The ISA every kernel uses unless a call names one: the best this CPU supports, or the one the
// environment variable PAGEDCORE_KERNEL_ISA names (any isa_name) when that one is supported.
Isa active_isa();
// Overrides active_isa() (tests and benchmarks); returns false and changes nothing if unsupported.
bool set_active_isa(Isa isa);

}  // namespace kernels
}  // namespace pagedcore
