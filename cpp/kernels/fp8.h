// The two 8-bit float formats of vLLM's --kv-cache-dtype fp8 / fp8_e4m3 / fp8_e5m2 (OCP FP8):
//
//   e4m3 (E4M3FN): s eeee mmm, bias 7, max finite 448, subnormals m * 2^-9, 0x7f / 0xff NaN, no inf
//   e5m2:          s eeeee mm, bias 15, max finite 57344, subnormals m * 2^-16 (the top byte of an fp16)
//
// Encoding rounds to the nearest value, ties to even, in one rounding from fp32, and saturates to the
// largest finite value (as vLLM's CUDA kernels do with __NV_SATFINITE: a cache never holds inf); NaN
// stays NaN. The scale is 1 (vLLM's default k_scale / v_scale without calibration).
//
// Only translation units compiled with baseline flags include this (cache_kernels.cc, tests): the
// attention kernels decode fp8 in their own per-ISA vector traits (vec_*.h load_fp8), so that no
// inline function here is compiled with AVX flags (see attention_kernel.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace pagedcore {
namespace kernels {

template <bool kE4M3>
inline uint8_t float_to_fp8(float x) {
  constexpr int kMant = kE4M3 ? 3 : 2;
  constexpr int kBias = kE4M3 ? 7 : 15;
  constexpr uint32_t kMaxCode = kE4M3 ? 0x7e : 0x7b;       // 448, 57344
  constexpr uint32_t kNanCode = kE4M3 ? 0x7f : 0x7e;
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 24) & 0x80;
  u &= 0x7fffffff;
  if (u > 0x7f800000) return static_cast<uint8_t>(sign | kNanCode);
  float a;
  std::memcpy(&a, &u, 4);
  uint32_t code;
  constexpr float kMinNormal = 1.f / static_cast<float>(1u << (kBias - 1));        // 2^(1 - bias)
  constexpr float kSubnormalScale = static_cast<float>(1u << (kBias - 1 + kMant));  // 1 / the subnormal step
  if (a < kMinNormal) {
    // Below the smallest normal: multiples of 2^(1 - bias - mant); nearbyint rounds ties to even, and
    // a result of 2^mant is exactly the smallest normal's code.
    code = static_cast<uint32_t>(std::nearbyint(a * kSubnormalScale));
  } else {
    constexpr int kShift = 23 - kMant;
    u += ((1u << (kShift - 1)) - 1) + ((u >> kShift) & 1);  // round the dropped bits, ties to even
    const uint32_t rounded = u >> kShift;                     // fp32 exponent and kMant bits
    const uint32_t offset = static_cast<uint32_t>(127 - kBias) << kMant;
    code = rounded - offset;                                  // >= 2^mant: a >= the smallest normal
    if (code > kMaxCode) code = kMaxCode;                     // saturate (inf included)
  }
  return static_cast<uint8_t>(sign | code);
}

template <bool kE4M3>
inline float fp8_to_float(uint8_t b) {
  constexpr int kMant = kE4M3 ? 3 : 2;
  constexpr int kBias = kE4M3 ? 7 : 15;
  const int e = (b & 0x7f) >> kMant;
  const int m = b & ((1 << kMant) - 1);
  float v;
  if (kE4M3 && (b & 0x7f) == 0x7f) v = NAN;
  else if (!kE4M3 && e == 31) v = m ? NAN : INFINITY;
  else if (e == 0) v = std::ldexp(static_cast<float>(m), 1 - kBias - kMant);
  else v = std::ldexp(static_cast<float>((1 << kMant) + m), e - kBias - kMant);
  return (b & 0x80) ? -v : v;
}

}  // namespace kernels
}  // namespace pagedcore
