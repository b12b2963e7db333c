#include "kernels/cpu_isa.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace pagedcore {
namespace kernels {
namespace {

const char* const kIsaNames[kNumIsas] = {"generic", "generic16", "avx2", "avx512", "avx512_bf16",
                                         "generic16_bf16", "avx512_vnni", "amx_bf16", "amx_int8"};

#if defined(__x86_64__) && defined(PAGEDCORE_KERNELS_X86)
// __builtin_cpu_supports also checks that the OS saves the wider registers (XCR0).
bool cpu_has_avx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
bool cpu_has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}
#endif

Isa best_isa() {
  if (const char* env = std::getenv("PAGEDCORE_KERNEL_ISA")) {
    Isa isa;
    if (isa_from_name(env, &isa) && isa_supported(isa)) return isa;
  }
  for (Isa isa : {Isa::kAvx512Bf16, Isa::kAvx512, Isa::kAvx2})
    if (isa_supported(isa)) return isa;
  return Isa::kGeneric;
}

std::atomic<int>& active_isa_slot() {
  static std::atomic<int> slot{static_cast<int>(best_isa())};
  return slot;
}

}  // namespace

const char* isa_name(Isa isa) {
  const int code = static_cast<int>(isa);
  return code >= 0 && code < kNumIsas ? kIsaNames[code] : "unknown";
}

bool isa_from_name(const char* name, Isa* isa) {
  for (int code = 0; code < kNumIsas; ++code) {
    if (std::strcmp(name, kIsaNames[code]) == 0) {
      *isa = static_cast<Isa>(code);
      return true;
    }
  }
  return false;
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::kGeneric:
    case Isa::kGeneric16:
    case Isa::kGeneric16Bf16:
      return true;
#if defined(__x86_64__) && defined(PAGEDCORE_KERNELS_X86)
    case Isa::kAvx2:
      return cpu_has_avx2();
    case Isa::kAvx512:
      return cpu_has_avx512();
    case Isa::kAvx512Bf16:
#ifdef PAGEDCORE_NO_AVX512BF16  // the compiler could not build the vdpbf16ps kernel
      return false;
#else
      // (VBMI too: the fp8 weights' bf16 conversion; every AVX512-BF16 CPU but Cooper Lake has it)
      return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vbmi");
#endif
    case Isa::kAvx512Vnni:
#ifdef PAGEDCORE_NO_AVX512VNNI  // the compiler could not build the vpdpbusd kernel
      return false;
#else
      return cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
#endif
#endif
    default:  // not built on this CPU family, or named room (kAmx*) not built yet
      return false;
  }
}

Isa active_isa() { return static_cast<Isa>(active_isa_slot().load(std::memory_order_relaxed)); }

bool set_active_isa(Isa isa) {
  if (!isa_supported(isa)) return false;
  active_isa_slot().store(static_cast<int>(isa), std::memory_order_relaxed);
  return true;
}

}  // namespace kernels
}  // namespace pagedcore
