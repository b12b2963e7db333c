// Exact scalar widenings of one weight to fp32, for the scalar tails of linear_impl.h's kernels (the K past
// the last whole vector chunk). Included by linear_impl.h inside each per-ISA translation unit: every unit
// has its own copy (no inline function is shared between units compiled for different ISAs: see
// attention_kernel.h), so these mirror kernel_types.h and fp8.h rather than call them.
#ifndef PC_ISA_NAMESPACE
#error "linear_scalar_impl.h is included by linear_impl.h"
#endif

#include <cstdint>
#include <cstring>

namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {

inline float bf16_scalar(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// IEEE fp16 -> fp32, exactly (kernel_types.h fp16_to_float's arithmetic).
inline float f16_scalar(uint16_t h) {
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  if (exp == 0x1fu) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else {  // zero or subnormal: man * 2^-24 is exact in fp32
    const float v = static_cast<float>(man) * 0x1p-24f;
    return sign ? -v : v;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// OCP e4m3 (s eeee mmm, bias 7) -> fp32, exactly (fp8.h fp8_to_float<true>'s values). The NaN codes 0x7f /
// 0xff read as +-480, as the vector traits' load_fp8 reads them: quantizers never write them, and the
// vector part and the tail of a row must agree.
inline float e4m3_scalar(uint8_t b) {
  const uint32_t exp = (b >> 3) & 0xfu, man = b & 0x7u;
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  if (exp == 0) {  // zero or subnormal: man * 2^-9 is exact in fp32
    const float v = static_cast<float>(man) * 0x1p-9f;
    return sign ? -v : v;
  }
  const uint32_t bits = sign | ((exp + 120) << 23) | (man << 20);  // rebias 7 -> 127
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
