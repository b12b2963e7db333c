#include "kernels/cpu_isa.h"

#include <atomic>
#include <initializer_list>
#include <cstdlib>
#include <cstring>

namespace pagedcore {
namespace kernels {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kGeneric: return "generic";
    case Isa::kGeneric16: return "generic16";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "unknown";
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::kGeneric:
    case Isa::kGeneric16:
      return true;
#if defined(__x86_64__) && defined(PAGEDCORE_KERNELS_X86)
    // __builtin_cpu_supports also checks that the OS saves the wider registers (XCR0).
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#endif
    default:
      return false;
  }
}

namespace {

Isa best_isa() {
  if (const char* env = std::getenv("PAGEDCORE_KERNEL_ISA")) {
    for (Isa isa : {Isa::kGeneric, Isa::kGeneric16, Isa::kAvx2, Isa::kAvx512}) {
      if (std::strcmp(env, isa_name(isa)) == 0 && isa_supported(isa)) return isa;
    }
  }
  if (isa_supported(Isa::kAvx512)) return Isa::kAvx512;
  if (isa_supported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kGeneric;
}

std::atomic<int>& active_isa_slot() {
  static std::atomic<int> slot{static_cast<int>(best_isa())};
  return slot;
}

}  // namespace

Isa active_isa() { return static_cast<Isa>(active_isa_slot().load(std::memory_order_relaxed)); }

bool set_active_isa(Isa isa) {
  if (!isa_supported(isa)) return false;
  active_isa_slot().store(static_cast<int>(isa), std::memory_order_relaxed);
  return true;
}

}  // namespace kernels
}  // namespace pagedcore
